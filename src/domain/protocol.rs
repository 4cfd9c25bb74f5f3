//! The binding protocols Agentry knows, parsed once from a binding's
//! `protocol` string. Records keep any protocol string (ADP lets
//! publishers name their own); only these are understood by the importers,
//! the gateway and the Agent Protocol surface.

use std::fmt;

/// A binding protocol the registry understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// AIDIP REST over TLS: the plain input is the body.
    Https,
    /// AIDIP REST without TLS (loopback and test agents).
    Http,
    /// WoA REST: the invocation envelope is the body.
    WoaRest,
    /// MCP over Streamable HTTP: a `tools/call`.
    Mcp,
    /// The Agent Protocol: a run of `stream_request`.
    AgentProtocol,
    /// A2A: `SendMessage` over JSON-RPC or HTTP+JSON.
    A2a,
}

impl Protocol {
    pub const ALL: [Protocol; 6] = [
        Protocol::Https,
        Protocol::Http,
        Protocol::WoaRest,
        Protocol::Mcp,
        Protocol::AgentProtocol,
        Protocol::A2a,
    ];

    /// The protocol a binding names (case-insensitive), if it is one of
    /// these.
    pub fn parse(name: &str) -> Option<Self> {
        let name = name.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name))
    }

    /// The name records store.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Https => "https",
            Protocol::Http => "http",
            Protocol::WoaRest => "woa-rest",
            Protocol::Mcp => "mcp",
            Protocol::AgentProtocol => "agent-protocol",
            Protocol::A2a => "a2a",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl super::Binding {
    /// The binding's protocol, when the registry understands it.
    pub fn known_protocol(&self) -> Option<Protocol> {
        Protocol::parse(&self.protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_stay_unknown() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.as_str()), Some(p));
        }
        assert_eq!(Protocol::parse(" A2A "), Some(Protocol::A2a));
        assert_eq!(Protocol::parse("grpc"), None);
        assert_eq!(Protocol::parse("com.example.queue"), None);
    }
}
