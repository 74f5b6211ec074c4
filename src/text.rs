//! Text from outside (registries, annotations, rpm-ostree and bootc messages) made fit for a
//! reason, a log field or a terminal: quoted, one line, bounded, inert.
//!
//! Inert means no control characters: a newline would split an sd_notify message (a registry's
//! error body could add `WATCHDOG=trigger`), an escape sequence would drive the terminal of
//! whoever reads the reason, a bidi override would make it read differently than it is.

use std::borrow::Cow;

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
/// characters (the last one `…` when cut). Every sink of outside text goes through this
/// (sd_notify `STATUS=`, D-Bus `Reason`/`Status`, annotations, Events): ANSI escape sequences
/// are dropped whole, other control characters and bidi controls dropped, tabs become spaces.
pub fn one_line(text: &str, max_chars: usize) -> String {
    let line: String = inert_lines(text)
        .iter()
        .map(|l| l.trim())
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

/// Whether `c` is a line break (C0, NEL and the Unicode separators).
fn is_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Bidi embeddings, overrides and isolates: invisible, and they reorder what follows.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The lines of `text` without control characters: escape sequences (CSI `ESC [ … final`, OSC
/// `ESC ] … BEL|ESC \\`, two-character `ESC x`) vanish whole, so no half of one is left to print.
fn inert_lines(text: &str) -> Vec<String> {
    enum Esc {
        None,
        Start,
        Csi,
        Osc,
    }
    let mut lines = vec![String::new()];
    let mut esc = Esc::None;
    for c in text.chars() {
        if is_break(c) {
            lines.push(String::new());
            esc = Esc::None;
            continue;
        }
        esc = match esc {
            Esc::Start if c == '[' => Esc::Csi,
            Esc::Start if c == ']' => Esc::Osc,
            Esc::Start => Esc::None,
            Esc::Csi if ('\u{40}'..='\u{7e}').contains(&c) => Esc::None,
            Esc::Csi => Esc::Csi,
            Esc::Osc if c == '\u{07}' => Esc::None,
            Esc::Osc if c == '\u{1b}' => Esc::Start,
            Esc::Osc => Esc::Osc,
            Esc::None if c == '\u{1b}' => Esc::Start,
            Esc::None => {
                if c == '\t' {
                    lines.last_mut().into_iter().for_each(|l| l.push(' '));
                } else if !c.is_control() && !is_bidi_control(c) {
                    lines.last_mut().into_iter().for_each(|l| l.push(c));
                }
                Esc::None
            }
        };
    }
    lines
}

/// `text` as a terminal may show it: control and bidi characters written as Rust escapes
/// (`\n`, `\u{1b}`), everything else as is. For what `streamctl` prints, which reaches a root
/// terminal and must show what is there rather than act on it.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || is_bidi_control(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
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
    fn reason_is_inert() {
        let body = "denied\nWATCHDOG=trigger\r\n\u{1b}[31mred\u{1b}[0m \u{1b}]0;title\u{07}t\tab\u{9b}2J\u{85}x\u{202e}y\u{0}z";
        let r = one_line_reason(body);
        assert_eq!(r, "denied; WATCHDOG=trigger; red t ab2J; xyz");
        assert!(!r.chars().any(char::is_control), "{r:?}");
        assert_eq!(one_line_reason("\u{1b}]8;;http://x\u{1b}\\link"), "link");
    }

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert!(matches!(printable("plain ü"), Cow::Borrowed("plain ü")));
        assert_eq!(
            printable("a\u{1b}[2Jb\nc\u{9b}d\u{202e}e"),
            "a\\u{1b}[2Jb\\nc\\u{9b}d\\u{202e}e"
        );
    }

    #[test]
    fn quote_shortens() {
        assert_eq!(quote("ab"), "\"ab\"");
        assert!(quote(&"z".repeat(300)).ends_with('…'));
    }
}
