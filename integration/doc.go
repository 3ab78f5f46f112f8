// Package integration proves tenure's guarantee against real servers: a real
// PostgreSQL (TENURE_TEST_DATABASE_URL, default the local server) and a
// Kafka-protocol broker (kfake in-process, or the cluster named by
// TENURE_TEST_BROKERS). Workers are real `tenure worker` processes, paused
// with real SIGSTOP/SIGCONT.
//
// Where things are: harness_test.go starts a test's world (env) and its
// workers (through internal/childproc, which the demo, the bench and the
// chaos run use too); history_test.go is the check every test ends with
// (checkRun: G1-G3, exactly once, the coordinator's side, each partition's
// count; verifyRun for a test that expects violations); the other files
// are the scenarios, one concern each.
package integration
