//! Leveled, one-line-per-event logging to stderr, behind the standard `log`
//! facade: code logs with `log::{error, warn, info, debug}!`, and this
//! module's small logger writes a timestamp, a level and the message.
//! Nothing is logged per request at the default level (`info`).

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Level, String> {
        match s {
            "error" => Ok(Level::Error),
            "warn" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            _ => Err(format!(
                "bad log level {s:?}: use error, warn, info or debug"
            )),
        }
    }
}

impl From<Level> for ::log::LevelFilter {
    fn from(level: Level) -> ::log::LevelFilter {
        match level {
            Level::Error => ::log::LevelFilter::Error,
            Level::Warn => ::log::LevelFilter::Warn,
            Level::Info => ::log::LevelFilter::Info,
            Level::Debug => ::log::LevelFilter::Debug,
        }
    }
}

/// Installs the stderr logger behind the `log` facade (once; later calls
/// only change the level) and lets through events at `level` and above.
pub fn set_level(level: Level) {
    // Fails only when a logger is already installed: then it is this one.
    let _ = ::log::set_logger(&STDERR_LOGGER);
    ::log::set_max_level(level.into());
}

static STDERR_LOGGER: StderrLogger = StderrLogger;

/// One line per event: `<RFC 3339 UTC time> <LEVEL> cubed: <message>`.
struct StderrLogger;

impl ::log::Log for StderrLogger {
    fn enabled(&self, metadata: &::log::Metadata<'_>) -> bool {
        metadata.level() <= ::log::max_level()
    }

    fn log(&self, record: &::log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let tag = match record.level() {
            ::log::Level::Error => "ERROR",
            ::log::Level::Warn => "WARN ",
            ::log::Level::Info => "INFO ",
            ::log::Level::Debug => "DEBUG",
            ::log::Level::Trace => "TRACE",
        };
        eprintln!("{} {tag} cubed: {}", utc_timestamp(), record.args());
    }

    // eprintln! writes each line unbuffered.
    fn flush(&self) {}
}

/// RFC 3339 UTC with milliseconds, computed without a date crate
/// (Howard Hinnant's days-to-civil algorithm).
fn utc_timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_shape() {
        let ts = super::utc_timestamp();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
    }

    #[test]
    fn the_level_reaches_the_facade() {
        use super::{Level, set_level};
        set_level(Level::Warn);
        assert!(::log::log_enabled!(::log::Level::Warn));
        assert!(!::log::log_enabled!(::log::Level::Info));
        set_level(Level::Debug);
        assert!(::log::log_enabled!(::log::Level::Debug));
        assert!(!::log::log_enabled!(::log::Level::Trace));
    }
}
