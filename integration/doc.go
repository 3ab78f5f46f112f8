// Package integration proves tenure's guarantee against real servers: a real
// PostgreSQL (TENURE_TEST_DATABASE_URL, default the local server) and a
// Kafka-protocol broker (kfake in-process, or the cluster named by
// TENURE_TEST_BROKERS). Workers are real `tenure worker` processes, paused
// with real SIGSTOP/SIGCONT.
package integration
