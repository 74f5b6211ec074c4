//! Maintenance windows (`spec.windows`): whether one is open at a given time, and when that
//! changes. Pure: the time is an argument; the time zones are jiff's bundled database, so the
//! answer does not depend on the image's `/usr/share/zoneinfo`.

use jiff::civil::{Date, Weekday as CivilWeekday};
use jiff::tz::TimeZone;
use jiff::{Span, Timestamp};

use crate::crd::{MaintenanceWindow, Weekday};
use crate::waves::WindowNow;

/// A window the controller cannot read; the pool is Degraded `InvalidSpec` (nothing is cordoned,
/// since when the pool may disrupt nodes is unknown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// `start` is not `HH:MM`.
    #[error("spec.windows[{0}].start {1:?}: expected HH:MM (24-hour)")]
    Start(usize, String),
    /// `durationMinutes` out of range.
    #[error("spec.windows[{0}].durationMinutes {1}: expected 1 to 10080 (a week)")]
    Duration(usize, u32),
    /// `timeZone` unknown.
    #[error("spec.windows[{0}].timeZone {1:?}: not a known IANA time zone")]
    TimeZone(usize, String),
}

/// The longest window, in minutes (a week: a window that never closes is no window).
pub const MAX_MINUTES: u32 = 7 * 24 * 60;

/// One window, resolved.
struct Resolved {
    days: Vec<CivilWeekday>,
    hour: i8,
    minute: i8,
    seconds: i64,
    tz: TimeZone,
}

fn resolve(i: usize, w: &MaintenanceWindow) -> Result<Resolved, WindowError> {
    let bad_start = || WindowError::Start(i, streamd::text::one_line(&w.start, 16));
    let (h, m) = w.start.split_once(':').ok_or_else(bad_start)?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(h) || !two_digits(m) {
        return Err(bad_start());
    }
    let hour: i8 = h.parse().map_err(|_| bad_start())?;
    let minute: i8 = m.parse().map_err(|_| bad_start())?;
    if hour > 23 || minute > 59 {
        return Err(bad_start());
    }
    if w.duration_minutes == 0 || w.duration_minutes > MAX_MINUTES {
        return Err(WindowError::Duration(i, w.duration_minutes));
    }
    let name = w.time_zone.as_deref().unwrap_or("UTC");
    let tz = TimeZone::get(name)
        .map_err(|_| WindowError::TimeZone(i, streamd::text::one_line(name, 64)))?;
    Ok(Resolved {
        days: w.days.iter().map(|d| civil(*d)).collect(),
        hour,
        minute,
        seconds: i64::from(w.duration_minutes) * 60,
        tz,
    })
}

fn civil(d: Weekday) -> CivilWeekday {
    match d {
        Weekday::Mon => CivilWeekday::Monday,
        Weekday::Tue => CivilWeekday::Tuesday,
        Weekday::Wed => CivilWeekday::Wednesday,
        Weekday::Thu => CivilWeekday::Thursday,
        Weekday::Fri => CivilWeekday::Friday,
        Weekday::Sat => CivilWeekday::Saturday,
        Weekday::Sun => CivilWeekday::Sunday,
    }
}

/// Checks every window (for the pool's `InvalidSpec`).
pub fn validate(windows: &[MaintenanceWindow]) -> Result<(), WindowError> {
    windows
        .iter()
        .enumerate()
        .try_for_each(|(i, w)| resolve(i, w).map(|_| ()))
}

/// Whether a window is open at `now` (Unix seconds), and in how many seconds that changes. No
/// windows: always open. A window starts on each of its `days` (every day when empty) at
/// `start` local time, and lasts `durationMinutes` (so one may run past midnight); a start
/// that falls into a daylight-saving gap moves forward, as RFC 5545 does.
pub fn now(windows: &[MaintenanceWindow], now: u64) -> Result<WindowNow, WindowError> {
    if windows.is_empty() {
        return Ok(WindowNow::default());
    }
    let resolved: Vec<Resolved> = windows
        .iter()
        .enumerate()
        .map(|(i, w)| resolve(i, w))
        .collect::<Result<_, _>>()?;
    let t = i64::try_from(now).unwrap_or(i64::MAX);
    let mut open_until: Option<i64> = None;
    let mut next_start: Option<i64> = None;
    for w in &resolved {
        for start in starts(w, t) {
            let end = start.saturating_add(w.seconds);
            if start <= t && t < end {
                open_until = Some(open_until.map_or(end, |u| u.max(end)));
            } else if start > t {
                next_start = Some(next_start.map_or(start, |s| s.min(start)));
            }
        }
    }
    let secs = |at: i64| u64::try_from(at.saturating_sub(t)).unwrap_or(0);
    Ok(match open_until {
        Some(end) => WindowNow {
            open: true,
            change_in: Some(secs(end)),
        },
        None => WindowNow {
            open: false,
            change_in: next_start.map(secs),
        },
    })
}

/// The window's starts from eight days before `t` to eight days after (its days in its zone).
fn starts(w: &Resolved, t: i64) -> Vec<i64> {
    let Ok(ts) = Timestamp::from_second(t) else {
        return Vec::new();
    };
    let today: Date = ts.to_zoned(w.tz.clone()).date();
    (-8i64..=8)
        .filter_map(|k| today.checked_add(Span::new().days(k)).ok())
        .filter(|d| w.days.is_empty() || w.days.contains(&d.weekday()))
        .filter_map(|d| d.at(w.hour, w.minute, 0, 0).to_zoned(w.tz.clone()).ok())
        .map(|z| z.timestamp().as_second())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(days: &[Weekday], start: &str, minutes: u32, tz: Option<&str>) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            duration_minutes: minutes,
            time_zone: tz.map(Into::into),
        }
    }

    /// Unix seconds of an RFC 3339 instant.
    fn at(s: &str) -> u64 {
        let ts: Timestamp = s.parse().expect("timestamp");
        u64::try_from(ts.as_second()).expect("after 1970")
    }

    #[test]
    fn no_windows_is_always_open() {
        assert_eq!(now(&[], 0), Ok(WindowNow::default()));
    }

    /// What, the windows, the time, open, the seconds to the next change.
    type Row<'a> = (&'a str, &'a [MaintenanceWindow], &'a str, bool, Option<u64>);

    #[test]
    fn open_and_closed_with_the_next_change() {
        // 2026-12-05 is a Saturday.
        let sat_night = [win(&[Weekday::Sat], "22:00", 240, None)];
        let sat_berlin = [win(&[Weekday::Sat], "22:00", 240, Some("Europe/Berlin"))];
        let daily = [win(&[], "01:30", 60, Some("America/New_York"))];
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("before the window: closed, opens at its start", &sat_night, "2026-12-05T21:00:00Z", false, Some(3_600)),
            ("at its start: open until its end", &sat_night, "2026-12-05T22:00:00Z", true, Some(4 * 3_600)),
            ("past midnight, still in it", &sat_night, "2026-12-06T01:59:59Z", true, Some(1)),
            ("at its end: closed until next week", &sat_night, "2026-12-06T02:00:00Z", false, Some(7 * 86_400 - 4 * 3_600)),
            ("another day: closed", &sat_night, "2026-12-09T23:00:00Z", false, Some(3 * 86_400 - 3_600)),
            ("in the window's zone (22:00 Berlin is 21:00 UTC in winter)", &sat_berlin, "2026-12-05T21:30:00Z", true, Some(3 * 3_600 + 1_800)),
            ("every day when no days are given", &daily, "2026-12-09T06:45:00Z", true, Some(45 * 60)),
            ("every day: closed until tomorrow's", &daily, "2026-12-09T07:30:00Z", false, Some(23 * 3_600)),
        ];
        for (what, windows, t, open, change_in) in table {
            assert_eq!(
                now(windows, at(t)),
                Ok(WindowNow { open, change_in }),
                "{what}"
            );
        }
    }

    #[test]
    fn overlapping_windows_stay_open_until_the_last_ends() {
        let w = [win(&[], "10:00", 60, None), win(&[], "10:30", 60, None)];
        let got = now(&w, at("2026-12-05T10:45:00Z")).expect("valid");
        assert_eq!(
            got,
            WindowNow {
                open: true,
                change_in: Some(45 * 60)
            }
        );
    }

    #[test]
    fn a_start_in_a_dst_gap_moves_forward() {
        // 2026-03-29 02:30 does not exist in Berlin; read with the offset before the gap it is
        // 03:30 CEST (01:30 UTC).
        let w = [win(&[Weekday::Sun], "02:30", 60, Some("Europe/Berlin"))];
        let before = now(&w, at("2026-03-29T01:20:00Z")).expect("valid");
        assert_eq!(
            before,
            WindowNow {
                open: false,
                change_in: Some(600)
            }
        );
        assert!(now(&w, at("2026-03-29T01:40:00Z")).expect("valid").open);
    }

    #[test]
    fn bad_windows_are_named_errors() {
        #[rustfmt::skip]
        let table: Vec<(MaintenanceWindow, WindowError)> = vec![
            (win(&[], "24:00", 60, None), WindowError::Start(0, "24:00".into())),
            (win(&[], "7:00", 60, None), WindowError::Start(0, "7:00".into())),
            (win(&[], "07:60", 60, None), WindowError::Start(0, "07:60".into())),
            (win(&[], "+1:00", 60, None), WindowError::Start(0, "+1:00".into())),
            (win(&[], "07:00", 0, None), WindowError::Duration(0, 0)),
            (win(&[], "07:00", MAX_MINUTES + 1, None), WindowError::Duration(0, MAX_MINUTES + 1)),
            (win(&[], "07:00", 60, Some("Mars/Olympus")), WindowError::TimeZone(0, "Mars/Olympus".into())),
        ];
        for (w, want) in table {
            let windows = [win(&[], "00:00", 10, None), w];
            let mut want = want;
            match &mut want {
                WindowError::Start(i, _)
                | WindowError::Duration(i, _)
                | WindowError::TimeZone(i, _) => *i = 1,
            }
            assert_eq!(validate(&windows), Err(want.clone()));
            assert_eq!(now(&windows, 0), Err(want));
        }
    }
}
