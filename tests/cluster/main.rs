//! Cluster tests: real `agentry` processes on loopback, real RocksDB, real
//! gRPC between nodes, with kill -9, restarts and injected network faults.

mod audit;
mod backup;
mod batching;
mod cluster_id;
mod consistency;
mod disk;
mod federation;
mod harness;
mod leases;
mod lincheck;
mod linearizability;
mod restarts;
mod scenarios;
