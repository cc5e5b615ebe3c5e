//! What a server counted, from `INFO commandstats`.

/// The field `field` (`calls`, `usec`, ..) of `command`'s line (`fcall`,
/// `evalsha`, ..) in the `INFO commandstats` of `connection`'s server: 0
/// before the command's first call.
///
/// # Panics
///
/// If the server does not answer `INFO`, or the field is not a number.
pub fn command_stat(connection: &mut redis::Connection, command: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(connection)
        .expect("INFO commandstats");
    let line = format!("cmdstat_{}:", command.to_ascii_lowercase());
    info.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))
        })
        .map_or(0, |value| {
            value.trim().parse().expect("a number in INFO commandstats")
        })
}

/// How many calls of `command` (`fcall`, `evalsha`, ..) the server ran so far.
pub fn calls_of(connection: &mut redis::Connection, command: &str) -> u64 {
    command_stat(connection, command, "calls")
}

/// The script calls the server ran so far (`FCALL`, `EVALSHA`, `EVAL`): one
/// per round trip of a check or of a batch, and one more for a script sent
/// again after `NOSCRIPT`.
pub fn script_calls(connection: &mut redis::Connection) -> u64 {
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|command| calls_of(connection, command))
        .sum()
}
