//! RFC 3339 timestamps as the drafts write them.

use time::{format_description::well_known::Rfc3339, OffsetDateTime};

/// Parses an RFC 3339 timestamp.
pub fn parse(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
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
