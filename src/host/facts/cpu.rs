//! x86-64 micro-architecture level from `/proc/cpuinfo` flags.
//!
//! RHEL 10 is built for x86-64-v3; on an older CPU its glibc refuses to start, which rpm-ostree
//! only finds out at the very end of a rebase. Reading the flags up front turns that into a
//! clear refusal.

use std::collections::BTreeSet;

/// Flags x86-64-v2 adds to the baseline.
const V2: &[&str] = &["cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"];
/// Flags x86-64-v3 adds to v2 (`abm` is how Linux names LZCNT).
const V3: &[&str] = &[
    "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
];
/// Flags x86-64-v4 adds to v3.
const V4: &[&str] = &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"];

/// The flags of the first processor in a cpuinfo text; CPUs of one machine share their ISA.
pub fn flags(cpuinfo: &str) -> Option<BTreeSet<&str>> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "flags").then(|| value.split_whitespace().collect())
    })
}

/// The highest x86-64 level (1..=4) whose flags are all present; `None` without a flags line
/// (not x86, or an unreadable cpuinfo).
pub fn x86_64_level(cpuinfo: &str) -> Option<u8> {
    let f = flags(cpuinfo)?;
    let has = |set: &[&str]| set.iter().all(|x| f.contains(x));
    let mut level = 1;
    for (n, set) in [(2, V2), (3, V3), (4, V4)] {
        if !has(set) {
            break;
        }
        level = n;
    }
    Some(level)
}

/// The flags of `level` that are missing (for a refusal message).
pub fn missing_for(cpuinfo: &str, level: u8) -> Vec<&'static str> {
    let f = flags(cpuinfo).unwrap_or_default();
    [(2, V2), (3, V3), (4, V4)]
        .into_iter()
        .filter(|(n, _)| *n <= level)
        .flat_map(|(_, set)| set.iter().copied())
        .filter(|x| !f.contains(x))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "fpu cx8 cmov mmx fxsr sse sse2 syscall lm";

    fn info(extra: &str) -> String {
        format!(
            "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {BASE} {extra}\nbogomips\t: 1\n\nprocessor\t: 1\nflags\t\t: {BASE}\n"
        )
    }

    #[test]
    fn levels_by_table() {
        let v2 = V2.join(" ");
        let v3 = format!("{v2} {}", V3.join(" "));
        let v4 = format!("{v3} {}", V4.join(" "));
        let v3_no_movbe = v3.replace("movbe", "");
        let cases = [
            (info(""), Some(1)),
            (info(&v2), Some(2)),
            (info(&v3), Some(3)),
            (info(&v4), Some(4)),
            (info(&v3_no_movbe), Some(2)),
            ("processor : 0\nFeatures : fp asimd\n".to_string(), None),
            (String::new(), None),
        ];
        for (text, want) in cases {
            assert_eq!(x86_64_level(&text), want, "{text}");
        }
        assert_eq!(missing_for(&info(&v3_no_movbe), 3), vec!["movbe"]);
    }
}
