// Package app is overage's composition root: every entry point assembles
// the system through it. The configuration is typed per role (DBConfig,
// ServeConfig, WorkConfig, IngestConfig, …), each reading exactly the
// variables it holds, with the defaults in one table (Vars). NewServer is
// `overage serve`, NewWorker `overage work`, OpenTool what a CLI command
// that queues jobs opens; `overage dev` wires a server and a worker on one
// pool (NewServerOn, NewWorkerOn). The commands and the tests call these
// constructors, so what a test runs is what ships.
package app
