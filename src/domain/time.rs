//! RFC 3339 timestamps as the drafts write them.

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// Parses an RFC 3339 timestamp.
pub fn parse(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// Parses an RFC 3339 timestamp or an ISO 8601 calendar date
/// (`2026-01-31`, read as its first instant in UTC), as filters take them.
pub fn parse_lenient(s: &str) -> Option<OffsetDateTime> {
    let s = s.trim();
    parse(s).or_else(|| {
        let format = time::macros::format_description!("[year]-[month]-[day]");
        time::Date::parse(s, &format)
            .ok()
            .map(|d| d.midnight().assume_utc())
    })
}

/// Formats a time as RFC 3339 in UTC.
pub fn format(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// The current time, RFC 3339 in UTC.
pub fn now() -> String {
    format(OffsetDateTime::now_utc())
}
