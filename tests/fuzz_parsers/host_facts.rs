//! Property tests of the host facts parsers: os-release, cpuinfo, CRI-O configuration, FIPS.

use std::collections::{BTreeMap, BTreeSet};

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};

use streamd::agent::preflight::stream_major;
use streamd::cluster::protocol::validate_stream;
use streamd::host::facts::fips::{Fips, fips};
use streamd::host::facts::{OsRelease, cpu, crio};

use super::{config, fail};

#[derive(Debug, Clone)]
enum OsLine {
    Kv {
        key: String,
        value: String,
        style: u8,
        indent: &'static str,
    },
    Comment(String),
    Blank,
    Junk(&'static str),
}

fn os_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "rhcos", "scos", "rhel", "centos", "fedora", "RHCOS", "rhcos ", ""
        ])
        .prop_map(String::from),
        select(vec!["coreos", "CoreOS", "server", "coreos "]).prop_map(String::from),
        "[0-9]{1,3}(\\.[0-9]{1,2}){0,2}",
        select(vec!["abc", "9.x", ".9", "99999999999", "4.20"]).prop_map(String::from),
        "[ -~é€]{0,12}",
    ]
}

fn os_line() -> impl Strategy<Value = OsLine> {
    let key = prop_oneof![
        4 => select(vec!["ID", "VARIANT_ID", "VERSION_ID", "RHEL_VERSION"]).prop_map(String::from),
        1 => "[A-Z_][A-Z0-9_]{0,8}",
    ];
    prop_oneof![
        8 => (key, os_value(), 0u8..3, select(vec!["", " ", "\t "])).prop_map(
            |(key, value, style, indent)| OsLine::Kv { key, value, style, indent }
        ),
        1 => "[ -~]{0,10}".prop_map(OsLine::Comment),
        1 => Just(OsLine::Blank),
        1 => select(vec!["no-eq", "=bad", "C D=1", "-X=1", "ID =rhcos", "ID.X=1"]).prop_map(OsLine::Junk),
    ]
}

fn render_os_line(l: &OsLine) -> String {
    match l {
        OsLine::Kv {
            key,
            value,
            style,
            indent,
        } => {
            let bare = value
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c));
            let single = !value.contains(['\'', '\\']);
            let v = match style {
                0 if bare => value.clone(),
                2 if single => format!("'{value}'"),
                _ => {
                    let mut o = String::from("\"");
                    for c in value.chars() {
                        if matches!(c, '"' | '\\' | '$' | '`') {
                            o.push('\\');
                        }
                        o.push(c);
                    }
                    o.push('"');
                    o
                }
            };
            format!("{indent}{key}={v}")
        }
        OsLine::Comment(c) => format!("#{c}"),
        OsLine::Blank => "  ".into(),
        OsLine::Junk(j) => (*j).into(),
    }
}

fn os_major(m: &BTreeMap<String, String>) -> Option<u32> {
    m.get("RHEL_VERSION")
        .or(m.get("VERSION_ID"))?
        .split('.')
        .next()?
        .parse()
        .ok()
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn osrelease_parses_what_was_written(
        lines in vec(os_line(), 0..8),
        eol in select(vec!["\n", "\r\n"]),
    ) {
        let text = lines.iter().map(render_os_line).collect::<Vec<_>>().join(eol);
        let mut want = BTreeMap::new();
        for l in &lines {
            if let OsLine::Kv { key, value, .. } = l {
                want.insert(key.clone(), value.clone());
            }
        }
        let os = OsRelease::parse(&text);
        for (k, v) in &want {
            prop_assert_eq!(os.get(k), Some(v.as_str()), "key {} of {:?}", k, text);
        }
        let coreos = want.get("VARIANT_ID").map(String::as_str) == Some("coreos");
        let family = match want.get("ID").map(String::as_str) {
            Some("rhcos") => Some("rhel"),
            Some("scos") => Some("centos"),
            Some("rhel") if coreos => Some("rhel"),
            Some("centos") if coreos => Some("centos"),
            _ => None,
        };
        let expected = family.zip(os_major(&want)).map(|(f, m)| format!("{f}-{m}"));
        let stream = os.stream();
        prop_assert_eq!(&stream, &expected, "{:?}", text);
        if let Some(s) = stream {
            prop_assert!(validate_stream(&s).is_ok(), "{:?} is not a valid stream", s);
            prop_assert_eq!(stream_major(&s), os.major());
        }
    }

    #[test]
    fn osrelease_arbitrary_text_names_only_documented_streams(
        text in prop_oneof![
            any::<String>(),
            "((ID|VARIANT_ID|VERSION_ID|RHEL_VERSION)=[\"']?(rhcos|scos|rhel|centos|coreos|[0-9.]{1,4}|\\\\|\")[\"']?\n){0,4}",
        ]
    ) {
        let os = OsRelease::parse(&text);
        if let Some(s) = os.stream() {
            let id = os.get("ID").unwrap_or_default();
            let documented = matches!(id, "rhcos" | "scos")
                || (matches!(id, "rhel" | "centos") && os.get("VARIANT_ID") == Some("coreos"));
            prop_assert!(documented, "stream {:?} for ID {:?}", s, id);
            prop_assert!(validate_stream(&s).is_ok(), "{:?}", s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// cpuinfo
// ---------------------------------------------------------------------------------------------

/// The x86-64 psABI micro-architecture levels as Linux names the flags (`abm` is LZCNT; SSE3,
/// `pni`, is not required by streamd: every CPU with SSSE3 has it).
const REF_V2: [&str; 6] = ["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"];
const REF_V3: [&str; 9] = [
    "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
];
const REF_V4: [&str; 5] = ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];
const NOISE_FLAGS: [&str; 6] = ["pni", "avx512_vnni", "sse4a", "avx2x", "xsaveopt", "avx512"];
const BASELINE: &str = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm";

fn all_level_flags() -> Vec<&'static str> {
    REF_V2
        .iter()
        .chain(&REF_V3)
        .chain(&REF_V4)
        .chain(&NOISE_FLAGS)
        .copied()
        .collect()
}

fn ref_required(level: u8) -> Vec<&'static str> {
    [(2, &REF_V2[..]), (3, &REF_V3[..]), (4, &REF_V4[..])]
        .into_iter()
        .filter(|(n, _)| *n <= level)
        .flat_map(|(_, s)| s.iter().copied())
        .collect()
}

fn ref_level(flags: &BTreeSet<&str>) -> u8 {
    (2..=4)
        .take_while(|l| ref_required(*l).iter().all(|f| flags.contains(f)))
        .last()
        .unwrap_or(1)
}

fn flag_set() -> impl Strategy<Value = BTreeSet<&'static str>> {
    let all = all_level_flags();
    vec(prop::bool::weighted(0.9), all.len()).prop_map(move |mask| {
        all.iter()
            .zip(mask)
            .filter(|(_, m)| *m)
            .map(|(f, _)| *f)
            .collect()
    })
}

fn cpuinfo_text(
    first: &BTreeSet<&str>,
    vmx: &BTreeSet<&str>,
    second: &BTreeSet<&str>,
    sep: &str,
) -> String {
    let j = |s: &BTreeSet<&str>| s.iter().copied().collect::<Vec<_>>().join(" ");
    format!(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Fuzz CPU @ 2.00GHz\nflags{sep}: {BASELINE} {}\nvmx flags\t: {}\nbugs\t\t: spectre_v1\n\nprocessor\t: 1\nflags\t\t: {BASELINE} {}\n",
        j(first),
        j(vmx),
        j(second)
    )
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn cpu_arbitrary_text_never_panics(text in prop_oneof![
        any::<String>(),
        "((flags|vmx flags|Features|processor)[ \t]*:[ a-z0-9_]{0,30}\n){0,4}",
    ]) {
        let level = cpu::x86_64_level(&text);
        prop_assert_eq!(level.is_some(), cpu::flags(&text).is_some());
        prop_assert!(level.is_none_or(|l| (1..=4).contains(&l)));
        for l in 0..=4 {
            let _ = cpu::missing_for(&text, l);
        }
    }

    #[test]
    fn cpu_level_is_the_first_cpus_and_monotone(
        first in flag_set(),
        extra in flag_set(),
        vmx in flag_set(),
        second in flag_set(),
        sep in select(vec!["\t\t", "\t", " ", ""]),
    ) {
        let text = cpuinfo_text(&first, &vmx, &second, sep);
        let level = cpu::x86_64_level(&text).ok_or_else(|| fail(text.clone()))?;
        prop_assert_eq!(level, ref_level(&first), "{}", text);

        let more: BTreeSet<&str> = first.union(&extra).copied().collect();
        let more_level = cpu::x86_64_level(&cpuinfo_text(&more, &vmx, &second, sep));
        prop_assert!(more_level >= Some(level), "adding {:?} lowered {} to {:?}", extra, level, more_level);

        for l in 0..=4u8 {
            let missing = cpu::missing_for(&text, l);
            prop_assert_eq!(missing.is_empty(), level >= l, "level {} missing_for({}) = {:?}", level, l, missing);
            let want: Vec<&str> = ref_required(l).into_iter().filter(|f| !first.contains(f)).collect();
            prop_assert_eq!(
                missing.iter().copied().collect::<BTreeSet<_>>(),
                want.into_iter().collect::<BTreeSet<_>>()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// crio
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum CrioFile {
    Sets(String, u8),
    Unrelated(u8),
    Bad(u8),
}

const CRIO_UNRELATED: [&str; 5] = [
    "",
    "# default_runtime = \"runc\"\n",
    "[crio]\nlog_level = \"debug\"\n",
    "[crio.runtime]\nconmon = \"/usr/bin/conmon\"\n",
    "[crio.runtime.runtimes.runc]\nruntime_path = \"\"\n",
];

const CRIO_BAD: [&str; 5] = [
    "[crio.runtime\n",
    "[crio.runtime]\ndefault_runtime = 1\n",
    "[crio.runtime]\ndefault_runtime = [\"crun\"]\n",
    "[crio.runtime]\ndefault_runtime = \"a\"\ndefault_runtime = \"b\"\n",
    "[crio.runtime]\ndefault_runtime = { name = \"crun\" }\n",
];

fn render_crio(f: &CrioFile) -> String {
    match f {
        CrioFile::Sets(r, style) => match style % 5 {
            0 => format!("[crio.runtime]\ndefault_runtime = \"{r}\"\n"),
            1 => format!("[crio]\nlog_level = \"info\"\n[crio.runtime]\ndefault_runtime = '{r}'\n"),
            2 => format!("crio.runtime.default_runtime = \"{r}\"\n"),
            3 => format!("[crio]\nruntime = {{ default_runtime = \"{r}\" }}\n"),
            _ => format!(
                "[crio.runtime]\n# default_runtime = \"x\"\ndefault_runtime = \"{r}\"\n\n[crio.runtime.runtimes.{r}]\nruntime_path = \"/usr/bin/{r}\"\n"
            ),
        },
        CrioFile::Unrelated(i) => CRIO_UNRELATED[*i as usize % CRIO_UNRELATED.len()].into(),
        CrioFile::Bad(i) => CRIO_BAD[*i as usize % CRIO_BAD.len()].into(),
    }
}

fn crio_good_file() -> impl Strategy<Value = CrioFile> {
    prop_oneof![
        ("[a-z][a-z0-9_-]{0,10}", any::<u8>()).prop_map(|(r, s)| CrioFile::Sets(r, s)),
        any::<u8>().prop_map(CrioFile::Unrelated),
    ]
}

fn crio_files(files: &[CrioFile]) -> Vec<(String, String)> {
    files
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("crio.conf.d/{i:02}.conf"), render_crio(f)))
        .collect()
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn crio_arbitrary_files_never_panic(files in vec(("[a-z]{1,6}\\.conf", prop_oneof![
        any::<String>(),
        "(\\[crio(\\.runtime)?\\]\n|default_runtime = (\"[a-z]{0,4}\"|[0-9]|true|\\[\\])\n|[a-z_]{1,6} = \"x\"\n){0,4}",
    ]), 0..4)) {
        match crio::default_runtime(&files) {
            Ok(r) => prop_assert!(!r.is_empty() || files.iter().any(|(_, t)| t.contains("default_runtime"))),
            Err(e) => prop_assert!(files.iter().any(|(f, _)| *f == e.file), "{:?} names no given file", e),
        }
    }

    #[test]
    fn crio_last_file_wins(files in vec(crio_good_file(), 0..6)) {
        let want = files
            .iter()
            .rev()
            .find_map(|f| match f {
                CrioFile::Sets(r, _) => Some(r.clone()),
                _ => None,
            })
            .unwrap_or_else(|| crio::CRIO_DEFAULT_RUNTIME.to_string());
        let rendered = crio_files(&files);
        prop_assert_eq!(crio::default_runtime(&rendered), Ok(want), "{:?}", rendered);
    }

    #[test]
    fn crio_first_bad_file_is_named(
        mut files in vec(crio_good_file(), 0..5),
        at in any::<Index>(),
        bad in any::<u8>(),
        later_bad in option::of(any::<u8>()),
    ) {
        let at = at.index(files.len() + 1);
        files.insert(at, CrioFile::Bad(bad));
        if let Some(b) = later_bad {
            files.push(CrioFile::Bad(b));
        }
        let rendered = crio_files(&files);
        let e = crio::default_runtime(&rendered).err().ok_or_else(|| fail(format!("{rendered:?} accepted")))?;
        prop_assert_eq!(&e.file, &rendered[at].0);
        prop_assert!(!e.message.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------
// fips
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn fips_arbitrary_input_never_panics(enabled in option::of(any::<String>()), cmdline in any::<String>()) {
        let _ = fips(enabled.as_deref(), &cmdline);
    }

    #[test]
    fn fips_last_fips_arg_and_kernel_must_agree(
        enabled in option::of(select(vec!["1", "1\n", " 1 ", "0", "0\n", "2", "", "10"])),
        tokens in vec(prop_oneof![
            select(vec!["fips=1", "fips=0", "fips=", "fips=yes", "nofips=1", "FIPS=1", "fips=1x", "BOOT_IMAGE=/vmlinuz", "rw", "quiet"]).prop_map(String::from),
            "[a-z_]{1,8}(=[a-z0-9]{0,4})?",
        ], 0..6),
        sep in select(vec![" ", "  ", "\t", "\n"]),
    ) {
        let cmdline = tokens.join(sep);
        let kernel = enabled.is_some_and(|v| v.trim() == "1");
        let cmd = tokens.iter().rev().find(|t| t.starts_with("fips=")).is_some_and(|t| t == "fips=1");
        let want = match (kernel, cmd) {
            (true, true) => Fips::Enabled,
            (false, false) => Fips::Disabled,
            _ => Fips::Inconsistent,
        };
        prop_assert_eq!(fips(enabled, &cmdline), want, "{:?} {:?}", enabled, cmdline);
    }
}
