// Package netfault runs a process in a network namespace of its own and
// injects real network faults between it and the services it talks to
// (the Kafka broker, PostgreSQL): packets silently dropped by nftables,
// in both directions or in one, then healed.
//
// # Why
//
// Killing or pausing a process is not what a network partition looks like.
// When a host vanishes or a firewall starts dropping packets, nobody sends
// a RST or a FIN: established connections stay open on both sides
// (half-open), writes are accepted into the send buffer and retransmitted
// in vain, reads block, and new connections time out instead of being
// refused. Only a timeout (the client's own, TCP_USER_TIMEOUT, keepalive,
// or the kernel's retransmission limit, about 15 minutes by default) ends
// such a connection. Code that survives a SIGKILL of its peer can still
// hang forever on a partition, so the chaos run needs the real thing.
//
// # How
//
// The worker must not need to know: it dials the same 127.0.0.1:<port>
// addresses as every other worker (kfake advertises 127.0.0.1 in its
// metadata). So New creates a namespace (`ip netns add tnf-<pid>-<n>`,
// loopback up) and, inside it, listens on 127.0.0.1:<port> for each service
// port. Each connection accepted there is forwarded to 127.0.0.1:<port> in
// the root namespace, where the real service listens:
//
//	worker ──► ns 127.0.0.1:p (forwarder) ══ forwarder ══► root 127.0.0.1:p (service)
//	└──────── inside the namespace ──────┘                └────── root namespace ──────┘
//
// The worker's TCP connections therefore end inside its namespace, and an
// nftables table there (inet tenure_netfault, input hook) drops their
// packets: to the service port (requests), from it (answers), or both.
// Dropping at input rather than output matters: a packet dropped at output
// makes the sender's own kernel report EPERM, which no vanished host does;
// at input it leaves the sender normally and simply never arrives.
//
// The listeners are created by this process itself: a goroutine locks its
// OS thread, setns(2)s into the namespace, listens, and switches the thread
// back before unlocking it (see Namespace.Do for why it does not simply
// let the thread die). Sockets keep the namespace they were created in, so
// accepting and forwarding then run on ordinary goroutines, and the
// forwarder's dials, from ordinary threads, reach the root namespace.
// Namespace.Do runs any function that way, for tests that need a socket of
// their own inside the namespace.
//
// Namespace.Blackhole adds, for the namespace's lifetime, addresses whose
// packets are always dropped (a loopback address other than 127.0.0.1,
// 127.0.0.2 say): a host that vanished, which a client meets as a connect
// that hangs until its own timeout, whatever faults come and go.
//
// Namespace.Command returns `ip netns exec <ns> <bin> <args>` as an
// *exec.Cmd: ip execs the program (it does not fork), so the PID in
// cmd.Process is the program's own, and SIGSTOP or SIGKILL by PID work as
// for any child.
//
// # What it does not model
//
// The forwarder terminates the worker's TCP connection: the service sees a
// healthy client (the forwarder) that simply stops talking during a cut.
// That is what a server sees of a vanished client until its keepalive or
// timeout notices; the services' own keepalives never fire here, but the
// forwarder's does, standing in for them: about 2.5 minutes of silence
// from the worker's side and the forwarder closes the service-side
// connection (see forwarderKeepAlive). Otherwise that connection ends when
// the worker's side ends (after Heal, or at Close). And
// when the service itself is down, the worker's connect succeeds (the
// forwarder's listener accepts) and is then reset, where a closed port
// would refuse it: ECONNRESET rather than ECONNREFUSED, both a plain
// "cannot reach" to the clients used here.
//
// # Cleanup
//
// Close stops the forwarders, closes every forwarded connection and deletes
// the namespace; NewT registers it with t.Cleanup. Stop the processes
// started with Command first: Close reports any still inside the namespace
// but does not kill them (only their starter should). New also deletes
// tnf-<pid>-* namespaces left by test processes that no longer exist.
//
// Everything stays on loopback: inside the namespace (its own lo) and on
// the root namespace's 127.0.0.1. Creating namespaces needs root and
// iproute2's ip; faults need nftables' nft (EnsureNftables installs
// Debian's package when run as root). When either is missing, New returns
// an error wrapping ErrUnsupported: CI must fail on it; unit tests of other
// packages under -short may skip.
package netfault
