//! Text from outside (registries, annotations, rpm-ostree and bootc messages) made fit for a
//! reason, a log field or a terminal: quoted, one line, bounded.

/// Longest `reason` value streamd writes, in characters.
pub const MAX_REASON_CHARS: usize = 1024;

/// Quotes a value for a reason message, shortened so a huge value cannot flood the annotation.
pub fn quote(value: &str) -> String {
    const MAX: usize = 80;
    if value.chars().count() > MAX {
        let head: String = value.chars().take(MAX).collect();
        format!("{head:?}…")
    } else {
        format!("{value:?}")
    }
}

/// Trims a reason to one line of at most [`MAX_REASON_CHARS`] characters.
pub fn one_line_reason(reason: &str) -> String {
    one_line(reason, MAX_REASON_CHARS)
}

/// Joins the non-empty lines of `text` with `; ` and cuts the result to at most `max_chars`
/// characters (the last one `…` when cut).
pub fn one_line(text: &str, max_chars: usize) -> String {
    let line: String = text
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if line.chars().count() > max_chars {
        let mut cut: String = line.chars().take(max_chars.saturating_sub(1)).collect();
        cut.push('…');
        cut
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_is_one_bounded_line() {
        assert_eq!(one_line_reason("a\n b \n\nc"), "a; b; c");
        let long = "x".repeat(5000);
        let r = one_line_reason(&long);
        assert_eq!(r.chars().count(), MAX_REASON_CHARS);
        assert!(r.ends_with('…'));
    }

    #[test]
    fn quote_shortens() {
        assert_eq!(quote("ab"), "\"ab\"");
        assert!(quote(&"z".repeat(300)).ends_with('…'));
    }
}
