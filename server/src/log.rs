//! Leveled, one-line-per-event logging to stderr, behind the standard `log`
//! facade: code logs with `log::{error, warn, info, debug}!`, and this
//! module's small logger writes a timestamp, a level and the message.
//! Nothing is logged per request at the default level (`info`).

use std::sync::{PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use ::log::LevelFilter;

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
/// only change the levels) and lets through events at `level` and above.
pub fn set_level(level: Level) {
    let filter = Filter {
        default: level.into(),
        directives: Vec::new(),
    };
    install(filter);
}

/// [`set_level`], with `RUST_LOG`-style directives on top when `rust_log`
/// is set: comma-separated `LEVEL` (replaces `level`) or `TARGET=LEVEL`
/// (e.g. `cube_server::connection=debug`); for each event the directive
/// with the longest matching target prefix wins.
pub fn init(level: Level, rust_log: Option<&str>) -> Result<(), String> {
    let mut filter = Filter {
        default: level.into(),
        directives: Vec::new(),
    };
    for part in rust_log.unwrap_or("").split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "bad RUST_LOG directive {part:?}: use LEVEL or TARGET=LEVEL, with LEVEL one of \
                 off, error, warn, info, debug, trace"
            )
        };
        match part.split_once('=') {
            Some((target, level)) if !target.is_empty() => {
                let level = level.parse().map_err(|_| bad())?;
                filter.directives.push((target.to_owned(), level));
            }
            Some(_) => return Err(bad()),
            None => filter.default = part.parse().map_err(|_| bad())?,
        }
    }
    install(filter);
    Ok(())
}

fn install(filter: Filter) {
    let most = filter
        .directives
        .iter()
        .map(|(_, level)| *level)
        .fold(filter.default, std::cmp::max);
    *FILTER.write().unwrap_or_else(PoisonError::into_inner) = filter;
    // Fails only when a logger is already installed: then it is this one.
    let _ = ::log::set_logger(&STDERR_LOGGER);
    ::log::set_max_level(most);
}

/// Which events reach stderr.
struct Filter {
    /// For events no directive names.
    default: LevelFilter,
    /// `(target prefix, level)`.
    directives: Vec<(String, LevelFilter)>,
}

impl Filter {
    fn level_for(&self, target: &str) -> LevelFilter {
        self.directives
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(self.default, |(_, level)| *level)
    }
}

static FILTER: RwLock<Filter> = RwLock::new(Filter {
    default: LevelFilter::Info,
    directives: Vec::new(),
});

static STDERR_LOGGER: StderrLogger = StderrLogger;

/// One line per event: `<RFC 3339 UTC time> <LEVEL> cubed: <message>`.
struct StderrLogger;

impl ::log::Log for StderrLogger {
    fn enabled(&self, metadata: &::log::Metadata<'_>) -> bool {
        let filter = FILTER.read().unwrap_or_else(PoisonError::into_inner);
        metadata.level() <= filter.level_for(metadata.target())
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

    /// The logger and its levels are process-wide: tests that set them
    /// take turns.
    static GLOBAL_LEVELS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_level_reaches_the_facade() {
        use super::{Level, set_level};
        let _turn = GLOBAL_LEVELS.lock();
        set_level(Level::Warn);
        assert!(::log::log_enabled!(::log::Level::Warn));
        assert!(!::log::log_enabled!(::log::Level::Info));
        set_level(Level::Debug);
        assert!(::log::log_enabled!(::log::Level::Debug));
        assert!(!::log::log_enabled!(::log::Level::Trace));
    }

    #[test]
    fn rust_log_directives_pick_the_longest_matching_target() {
        use super::{Level, LevelFilter, init};
        let _turn = GLOBAL_LEVELS.lock();
        init(
            Level::Warn,
            Some("cube_server=info, cube_server::connection=debug"),
        )
        .unwrap();
        let filter = super::FILTER.read().unwrap();
        assert_eq!(filter.level_for("cube_store::wal"), LevelFilter::Warn);
        assert_eq!(filter.level_for("cube_server::server"), LevelFilter::Info);
        assert_eq!(
            filter.level_for("cube_server::connection"),
            LevelFilter::Debug
        );
        drop(filter);
        assert_eq!(::log::max_level(), LevelFilter::Debug);
        init(Level::Warn, Some("error")).unwrap();
        assert_eq!(::log::max_level(), LevelFilter::Error);
    }

    #[test]
    fn bad_rust_log_directives_say_what_to_write() {
        use super::{Level, init};
        for bad in ["loud", "=debug", "cube_server=loud"] {
            let why = init(Level::Info, Some(bad)).unwrap_err();
            assert!(why.contains(&format!("{bad:?}")), "{why}");
            assert!(why.contains("TARGET=LEVEL"), "{why}");
        }
    }
}
