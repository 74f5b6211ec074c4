//! The man pages `streamctl generate man` writes: `streamctl(8)` and one page per subcommand
//! (from the same command definitions as `--help`), and `streamd.conf(5)`, from the key table
//! of docs/config.md (the one description of every key, checked against the shipped defaults
//! by the RPM's %check).

use std::io::Write as _;
use std::path::Path;

/// docs/config.md, as built in.
const CONFIG_MD: &str = include_str!("../../../docs/config.md");

/// Writes `streamctl.8`, `streamctl-<sub>.8` for each visible subcommand, and `streamd.conf.5`.
pub fn write_all(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = cmd;
    // Gives each subcommand its display name, `streamctl-<sub>`, as clap_mangen's own
    // `generate_to` does.
    cmd.build();
    write_page(&cmd, "streamctl", dir)?;
    // clap's own `help` subcommand is `--help`, documented on every page.
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = sub.get_display_name().unwrap_or(sub.get_name());
        write_page(sub, name, dir)?;
    }
    std::fs::write(dir.join("streamd.conf.5"), config_page())
}

fn write_page(cmd: &clap::Command, name: &str, dir: &Path) -> std::io::Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .render(&mut out)?;
    std::fs::File::create(dir.join(format!("{name}.8")))?.write_all(&out)
}

/// One row of the key table: key, type, default, meaning (Markdown).
fn rows(md: &str) -> Vec<[String; 4]> {
    md.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l
                .trim()
                .strip_prefix('|')?
                .strip_suffix('|')?
                .split(" | ")
                .collect();
            let [key, kind, default, meaning] = cells.as_slice() else {
                return None;
            };
            let key = key.trim().strip_prefix('`')?.strip_suffix('`')?;
            key.chars()
                .all(|c| c.is_ascii_lowercase() || c == '-')
                .then(|| [key, kind, default, meaning].map(|c| plain(c.trim())))
        })
        .collect()
}

/// Markdown to roff text: code spans and links lose their marks, a leading dot or quote is
/// escaped (roff would read it as a request), backslashes doubled.
fn plain(md: &str) -> String {
    let mut out = String::new();
    let mut rest = md;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after
            .find("](")
            .and_then(|j| after[j..].find(')').map(|k| (j, j + k)))
        {
            Some((j, end)) => {
                out.push_str(&after[..j]);
                rest = &after[end + 1..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let text = out.replace('`', "").replace('\\', "\\\\");
    if text.starts_with(['.', '\'']) {
        format!("\\&{text}")
    } else {
        text
    }
}

fn config_page() -> String {
    let mut page = String::from(
        ".TH STREAMD.CONF 5 \"\" \"streamd\" \"File Formats\"\n\
         .SH NAME\nstreamd.conf \\- streamd configuration drop-ins\n\
         .SH SYNOPSIS\n/usr/lib/streamd/config.d/*.toml, /etc/streamd/config.d/*.toml\n\
         .SH DESCRIPTION\nstreamd reads TOML drop-ins from the two directories, in that order; files are \
         applied in the order of their names and a key set by a later file wins. A file in a later \
         directory masks the file of the same name in an earlier one; a symlink to /dev/null masks \
         it without adding anything. An unknown key, a value of the wrong type, a syntax error or a \
         file that is not *.toml is an error naming file:line:column, and streamd refuses to start \
         (exit status 2). Check drop-ins with \\fBstreamctl config check\\fR.\n.SH KEYS\n",
    );
    for [key, kind, default, meaning] in rows(CONFIG_MD) {
        page.push_str(&format!(
            ".TP\n\\fB{key}\\fR (\\fI{kind}\\fR; default {default})\n{meaning}\n"
        ));
    }
    page.push_str(
        ".SH EXAMPLE\n.nf\n# /etc/streamd/config.d/50-site.toml\nnode-name = \"worker-0\"\n\
         reboot = \"on-approval\"\nallowed-repositories = [\"quay.io/openshift-release-dev\"]\n.fi\n\
         .SH SEE ALSO\n\\fBstreamd\\fR(8), \\fBstreamctl\\fR(8)\n",
    );
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_key_is_in_the_page_once() {
        let keys: Vec<String> = rows(CONFIG_MD).into_iter().map(|[k, ..]| k).collect();
        assert!(keys.len() >= 20, "{keys:?}");
        for k in [
            "node-name",
            "kubeconfig",
            "mode",
            "heartbeat-namespace",
            "reboot",
        ] {
            assert!(keys.iter().any(|x| x == k), "{k} in {keys:?}");
        }
        let page = config_page();
        for k in &keys {
            assert_eq!(page.matches(&format!("\\fB{k}\\fR (")).count(), 1, "{k}");
        }
    }

    #[test]
    fn markdown_becomes_inert_roff() {
        assert_eq!(
            plain("see [protocol](protocol.md#x) and `a`"),
            "see protocol and a"
        );
        assert_eq!(plain(".hidden"), "\\&.hidden");
        assert_eq!(plain("a\\b [not a link"), "a\\\\b [not a link");
    }
}
