package netfault

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Direction says which packets of a service's connections are dropped.
// Requests are packets to the service port (from the process inside the
// namespace), answers packets from it; TCP's ACKs travel with them, so
// dropping only answers also hides from the client that its requests
// arrived.
type Direction int

const (
	// Both: nothing passes; a vanished host or a partition.
	Both Direction = iota + 1
	// Requests: the service never hears from the client.
	Requests
	// Answers: requests arrive and are acted on, answers never come back.
	Answers
)

var directionNames = map[Direction]string{Both: "both", Requests: "requests", Answers: "answers"}

func (d Direction) String() string { return enumName(d, directionNames, "Direction") }

// enumName is v's name in names, or the type's name and v's number for a
// value names does not have.
func enumName[T ~int](v T, names map[T]string, typ string) string {
	if s, ok := names[v]; ok {
		return s
	}
	return fmt.Sprintf("%s(%d)", typ, int(v))
}

// Fault drops the packets of connections to Ports in direction Drop.
type Fault struct {
	Ports []int
	Drop  Direction
}

func (f Fault) String() string {
	return fmt.Sprintf("drop %s on ports %v", f.Drop, f.Ports)
}

// Cut drops everything to and from ports.
func Cut(ports ...int) Fault { return Fault{Ports: ports, Drop: Both} }

// DropRequests drops the packets sent to ports.
func DropRequests(ports ...int) Fault { return Fault{Ports: ports, Drop: Requests} }

// DropAnswers drops the packets sent from ports: requests arrive, answers
// do not.
func DropAnswers(ports ...int) Fault { return Fault{Ports: ports, Drop: Answers} }

// table is the only nftables table this package touches. Faults live in a
// namespace of their own, so it never meets the host's rules.
const table = "inet tenure_netfault"

// Inject replaces the faults in force with faults (none: Heal). The change
// is one nftables transaction: there is no moment with neither the old nor
// the new rules.
func (n *Namespace) Inject(faults ...Fault) error {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	n.mu.Lock()
	holes := slices.Clone(n.holes)
	n.mu.Unlock()
	return n.apply(holes, faults)
}

// Blackhole makes addrs hosts that vanished, for as long as the namespace
// lives: every packet sent to them inside the namespace is dropped, so a
// connection to one hangs in SYN retransmissions until the client's own
// timeout, where an address nobody listens on would refuse it at once.
// Faults come and go (Inject, Heal) without touching them. Each must be a
// loopback address other than 127.0.0.1 (which carries the forwarders):
// the namespace's lo answers for all of 127.0.0.0/8, so 127.0.0.2 is a
// host of its own there. A client given a multi-host database URL whose
// first host is one of them meets a dead first host (the chaos run's
// partition-multi-host fault).
func (n *Namespace) Blackhole(addrs ...netip.Addr) error {
	for _, a := range addrs {
		if !a.Is4() || !a.IsLoopback() || a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
			return fmt.Errorf("netfault: blackhole %s: not an IPv4 loopback address other than 127.0.0.1", a)
		}
	}
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	n.mu.Lock()
	holes := slices.Clone(n.holes)
	faults := slices.Clone(n.faults)
	n.mu.Unlock()
	for _, a := range addrs {
		if !slices.Contains(holes, a) {
			holes = append(holes, a)
		}
	}
	return n.apply(holes, faults)
}

// Blackholes are the addresses Blackhole dropped.
func (n *Namespace) Blackholes() []netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.holes)
}

// apply installs holes and faults in one nftables transaction and records
// them; applyMu is held.
func (n *Namespace) apply(holes []netip.Addr, faults []Fault) error {
	script, err := ruleset(holes, faults)
	if err != nil {
		return err
	}
	if err := n.nft(script); err != nil {
		return err
	}
	n.mu.Lock()
	n.holes, n.faults = holes, slices.Clone(faults)
	n.mu.Unlock()
	return nil
}

// Heal removes every fault. Established connections recover by TCP
// retransmission, whose interval doubles while cut (from 200 ms on
// loopback, capped at 120 s): after a long cut a connection can take about
// as long as the cut lasted to carry data again, unless the application
// gives up on it first.
func (n *Namespace) Heal() error { return n.Inject() }

// Faults are the faults in force.
func (n *Namespace) Faults() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.faults)
}

func (n *Namespace) nft(script string) error {
	n.mu.Lock()
	closed := n.closed
	n.mu.Unlock()
	if closed {
		return errors.New("netfault: namespace closed")
	}
	nft, err := nftPath()
	if err != nil {
		return err
	}
	if out, err := run(strings.NewReader(script), "ip", "netns", "exec", n.name, nft, "-f", "-"); err != nil {
		return fmt.Errorf("netfault: nft in %s: %v: %s\nscript:\n%s", n.name, err, out, script)
	}
	return nil
}

// ruleset renders faults as an nft script that replaces the table: "table"
// then "delete table" makes the deletion valid whether or not the table
// exists, and the whole script is applied atomically. The chain hooks
// input, not output: on output the drop would be reported to the sending
// socket as EPERM, a local error no vanished peer produces; on input the
// packet is sent normally and lost. Both ends of every affected connection
// are inside the namespace (the process and the forwarder), so each packet
// passes input exactly once. The forwarder's listeners own the service
// ports, so the kernel never picks one as a client's ephemeral port, and
// "sport = service port" means an answer. The blackholed addresses come
// first: every packet to them is dropped, whatever the faults.
func ruleset(holes []netip.Addr, faults []Fault) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s\ndelete table %s\n", table, table)
	if len(faults) == 0 && len(holes) == 0 {
		return b.String(), nil
	}
	fmt.Fprintf(&b, "table %s {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n", table)
	if len(holes) > 0 {
		as := make([]string, len(holes))
		for i, a := range holes {
			if !a.Is4() {
				return "", fmt.Errorf("netfault: blackhole %s is not IPv4", a)
			}
			as[i] = a.String()
		}
		fmt.Fprintf(&b, "\t\tip daddr { %s } drop\n", strings.Join(as, ", "))
	}
	for _, f := range faults {
		if len(f.Ports) == 0 {
			return "", fmt.Errorf("netfault: fault %v has no ports", f)
		}
		ports := make([]string, len(f.Ports))
		for i, p := range f.Ports {
			if p <= 0 || p > 65535 {
				return "", fmt.Errorf("netfault: fault %v: bad port %d", f, p)
			}
			ports[i] = strconv.Itoa(p)
		}
		set := "{ " + strings.Join(ports, ", ") + " }"
		switch f.Drop {
		case Both:
			fmt.Fprintf(&b, "\t\ttcp dport %s drop\n\t\ttcp sport %s drop\n", set, set)
		case Requests:
			fmt.Fprintf(&b, "\t\ttcp dport %s drop\n", set)
		case Answers:
			fmt.Fprintf(&b, "\t\ttcp sport %s drop\n", set)
		default:
			return "", fmt.Errorf("netfault: fault %v: unknown direction", f)
		}
	}
	b.WriteString("\t}\n}\n")
	return b.String(), nil
}

// Kind is a fault the chaos run injects between a worker and its services.
type Kind int

const (
	KafkaCut       Kind = iota + 1 // Kafka unreachable, both directions
	PostgresCut                    // Postgres unreachable, both directions
	KafkaOneWay                    // Kafka gets requests, answers are lost
	PostgresOneWay                 // Postgres gets (and runs) statements, answers are lost
	FullCut                        // both services unreachable: the worker's host vanished
)

// Kinds lists every Kind, for a chaos schedule to draw from.
func Kinds() []Kind { return []Kind{KafkaCut, PostgresCut, KafkaOneWay, PostgresOneWay, FullCut} }

var kindNames = map[Kind]string{
	KafkaCut:       "kafka-cut",
	PostgresCut:    "postgres-cut",
	KafkaOneWay:    "kafka-one-way",
	PostgresOneWay: "postgres-one-way",
	FullCut:        "full-cut",
}

func (k Kind) String() string { return enumName(k, kindNames, "Kind") }

// Services names a worker's service ports: the broker port(s) and the
// Postgres port(s) (several for a multi-host URL).
type Services struct {
	Kafka    []int
	Postgres []int
}

// Ports are all of them, for New.
func (s Services) Ports() []int { return append(slices.Clone(s.Kafka), s.Postgres...) }

// Faults are the faults that make kind k.
func (s Services) Faults(k Kind) []Fault {
	switch k {
	case KafkaCut:
		return []Fault{Cut(s.Kafka...)}
	case PostgresCut:
		return []Fault{Cut(s.Postgres...)}
	case KafkaOneWay:
		return []Fault{DropAnswers(s.Kafka...)}
	case PostgresOneWay:
		return []Fault{DropAnswers(s.Postgres...)}
	case FullCut:
		return []Fault{Cut(s.Ports()...)}
	}
	return nil
}
