// Package testinfra holds what the tests need and the product does not: a
// database per test (testdb), a throwaway PostgreSQL (pgtest), a
// pg_auto_failover formation (pgha), a fault-injecting Postgres proxy
// (pgproxy), network namespaces with faults (netfault), a test's own
// topics and end offsets on Kafka (kafkatest), ports outside the
// ephemeral range (freeport), certificates (testcert), an S3 store
// (weedtest), the tenure binary built for the tests to run (tenurebin) and
// the Markdown whose commands tests run as written (mdtest).
// Only test files and packages under this folder import them.
package testinfra
