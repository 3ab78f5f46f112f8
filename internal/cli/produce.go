package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/internal/otelsetup"
	"github.com/tenure-dev/tenure/internal/tick"
	"github.com/tenure-dev/tenure/partition"
)

var produceSpec = spec{name: "produce", short: "produce jobs (key + value) to a topic, keyed like the Java client (murmur2)",
	long: "Give exactly one of --key K --value V, --input FILE|- or --generate N [--key-count K]."}

const (
	// defaultMaxJobBytes is the default --max-bytes: Kafka's default
	// message.max.bytes is a little above it.
	defaultMaxJobBytes = 1 << 20
	// perKeyListMax: inputs with at most this many distinct keys are
	// reported key by key, larger ones partition by partition.
	perKeyListMax = 20
)

// job is one validated record to produce.
type job struct {
	key, value []byte
	line       int // input line, 0 for --key or --generate
}

// maxJobBytesLimit bounds --max-bytes: kgo refuses batches above its
// 100 MiB broker write limit, and brokers refuse far smaller ones by default.
const maxJobBytesLimit = 64 << 20

// produceCmd is `tenure produce`.
type produceCmd struct {
	base
	kafka                    kafkaFlags
	topic, key, value, input string
	generate, keyCount       int
	maxBytes                 int
	flags                    *flagSet
	keyGiven, generating     bool
}

func (c *produceCmd) define(f *flagSet) {
	c.flags = f
	c.kafka.define(f, brokersUsage, required)
	f.String(&c.topic, "topic", "", "topic to produce to; it must exist (tenure admin topic create)", arg("T"), required)
	f.String(&c.key, "key", "", "the job's key: it decides the partition, so the owner", arg("K"))
	f.String(&c.value, "value", "", "the job's value (with --key); may be empty", arg("V"))
	f.String(&c.input, "input", "", `JSON lines file, one job per line: {"key": "...", "value": ...}, or - for stdin; a string value is produced as its raw bytes, any other JSON value as compact JSON`, arg("FILE|-"))
	f.Int(&c.generate, "generate", 0, "produce N demo jobs, keys key-0..key-(K-1) (K: --key-count), values {\"seq\":i}")
	f.Int(&c.keyCount, "key-count", 10, "number of distinct keys with --generate", arg("K"))
	f.Int(&c.maxBytes, "max-bytes", defaultMaxJobBytes, fmt.Sprintf("largest job accepted (key + value bytes, at most %d); larger ones are refused before anything is produced", maxJobBytesLimit))
}

func (c *produceCmd) check([]string) error {
	if err := validTopic("topic", c.topic); err != nil {
		return err
	}
	f := c.flags
	c.keyGiven = f.given("key") || c.key != ""
	valueGiven := f.given("value") || c.value != ""
	c.generating = f.given("generate") || c.generate != 0
	modes := 0
	for _, set := range []bool{c.keyGiven || valueGiven, c.input != "", c.generating} {
		if set {
			modes++
		}
	}
	switch {
	case modes != 1:
		return usagef("give exactly one of --key K --value V, --input FILE|-, or --generate N")
	case valueGiven && !c.keyGiven:
		return usagef("--value needs --key: tenure jobs must have a key")
	case c.keyGiven && c.key == "":
		return usagef("--key is empty: tenure jobs must have a key (it decides the partition, so the owner)")
	case c.keyGiven && !valueGiven:
		return usagef("--key needs --value (an empty value is --value '')")
	case c.generating && c.generate < 1:
		return usagef("--generate must be at least 1")
	case f.given("key-count") && !c.generating:
		return usagef("--key-count goes with --generate")
	case c.keyCount < 1:
		return usagef("--key-count must be at least 1")
	case c.maxBytes < 1 || c.maxBytes > maxJobBytesLimit:
		return usagef("--max-bytes must be from 1 to %d", maxJobBytesLimit)
	}
	return nil
}

func (c *produceCmd) run(ctx context.Context) error {
	// Everything is read and validated before anything is sent: a bad job
	// anywhere in the input produces nothing.
	var jobs []job
	switch {
	case c.keyGiven:
		j := job{key: []byte(c.key), value: []byte(c.value)}
		if err := checkJob(j, c.maxBytes); err != nil {
			return fmt.Errorf("%s; nothing was produced", err)
		}
		jobs = []job{j}
	case c.input != "":
		var err error
		jobs, err = readJobs(c.stdin, c.input, c.maxBytes)
		if err != nil {
			return err
		}
		if len(jobs) == 0 {
			return fmt.Errorf("%s has no jobs; nothing was produced", inputName(c.input))
		}
	}

	largest := 0
	for _, j := range jobs {
		largest = max(largest, len(j.key)+len(j.value))
	}
	// Tracing, from the OTEL_* environment; off unless it asks for it:
	// kotel's hooks give each job a publish span and write its context
	// into the record's headers, where the worker links to it.
	tr, err := otelsetup.Setup(ctx, "tenure-produce", "", func(err error) { fmt.Fprintln(c.stderr, "tenure produce: tracing:", err) })
	if err != nil {
		return usageError{msg: err.Error()}
	}
	defer func() { _ = tr.Close() }() // after cl.Close: the last publish spans end there
	cl, err := producerClient(&c.kafka, c.kafka.list(), largest, tr.KgoOpts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	counts, err := checkTopics(ctx, cl, c.kafka.list(), []string{c.topic})
	if err != nil {
		return err
	}

	total := len(jobs)
	if c.generating {
		total = c.generate
	}
	p := newProduction(c.topic, counts[c.topic], total)
	// Progress, on a terminal only: never into a pipe or a file.
	stop := startProgress(c.stderr, p.progressLine)
	if c.generating {
		err = p.run(ctx, cl, func(yield func(job) bool) {
			for i := range c.generate {
				k := "key-" + strconv.Itoa(i%c.keyCount)
				if !yield(job{key: []byte(k), value: []byte(`{"seq":` + strconv.Itoa(i) + `}`)}) {
					return
				}
			}
		})
	} else {
		err = p.run(ctx, cl, func(yield func(job) bool) {
			for _, j := range jobs {
				if !yield(j) {
					return
				}
			}
		})
	}
	stop()
	perKey := !c.generating && len(p.byKey) <= perKeyListMax
	if err != nil {
		// What was acknowledged stays in the topic: say where it is.
		if p.acked > 0 {
			if rerr := p.report(c.stdout, perKey, stopSignal(ctx)); rerr != nil {
				return rerr
			}
		}
		return err
	}
	return p.report(c.stdout, perKey, "")
}

// checkJob applies the rules every job must pass.
func checkJob(j job, maxBytes int) error {
	if len(j.key) == 0 {
		return errors.New("the job has no key (tenure jobs must have a key: it decides the partition, so the owner)")
	}
	if !utf8.Valid(j.key) {
		return errors.New("the job's key is not valid UTF-8")
	}
	if size := len(j.key) + len(j.value); size > maxBytes {
		return fmt.Errorf("the job with key %q is %d bytes, more than --max-bytes %d", abbreviate(string(j.key)), size, maxBytes)
	}
	return nil
}

func inputName(path string) string {
	if path == "-" {
		return "standard input"
	}
	return path
}

// readJobs reads and validates every line of path ("-": stdin). Blank lines
// are skipped. The first bad line is the error.
func readJobs(stdin io.Reader, path string, maxBytes int) ([]job, error) {
	r := stdin
	if path == "-" && r == nil {
		return nil, errors.New("--input - reads standard input, and there is none")
	}
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("cannot read the input: %s", pathErr(err))
		}
		defer f.Close()
		r = f
	}
	br := bufio.NewReaderSize(r, 64<<10)
	name := inputName(path)
	var jobs []job
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("reading %s: %v; nothing was produced", name, err)
		}
		if len(bytes.TrimSpace(b)) > 0 {
			j, perr := parseJobLine(b, maxBytes)
			if perr != nil {
				return nil, fmt.Errorf("line %d of %s: %s; nothing was produced", line, name, perr)
			}
			j.line = line
			jobs = append(jobs, j)
		}
		if err == io.EOF {
			return jobs, nil
		}
	}
}

func pathErr(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Path + ": " + pe.Err.Error()
	}
	return err.Error()
}

// parseJobLine parses {"key": "...", "value": ...}: the key a non-empty JSON
// string, the value any JSON (a string is produced as its raw bytes, anything
// else as compact JSON). Field names are exact; a field given twice or any
// other field is refused (encoding/json would keep the last one silently).
func parseJobLine(b []byte, maxBytes int) (job, error) {
	const shape = `not a JSON object {"key": "...", "value": ...}`
	if !utf8.Valid(b) {
		// encoding/json would silently replace the bytes with U+FFFD,
		// changing the key (and so the partition) or the value.
		i := 0
		for i < len(b) {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		return job{}, fmt.Errorf("the line is not valid UTF-8 (byte %d is 0x%02x); JSON text must be UTF-8", i+1, b[i])
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return job{}, fmt.Errorf("%s: %s", shape, jsonCause(err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return job{}, fmt.Errorf("%s: the line is a JSON %s", shape, jsonKind(tok))
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return job{}, fmt.Errorf("%s: %s", shape, jsonCause(err))
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return job{}, fmt.Errorf("%s: %s", shape, jsonCause(err))
		}
		switch _, dup := fields[name]; {
		case name != "key" && name != "value":
			return job{}, fmt.Errorf(`unknown field %q (a job has a "key" and a "value")`, abbreviate(name))
		case dup:
			return job{}, fmt.Errorf("%q is given twice", name)
		}
		fields[name] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return job{}, fmt.Errorf("%s: %s", shape, jsonCause(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return job{}, errors.New("unexpected data after the JSON object (one job per line)")
	}
	var j job
	switch k := bytes.TrimSpace(fields["key"]); {
	case len(k) == 0 || string(k) == "null":
		return job{}, errors.New(`the job has no "key" (tenure jobs must have a key: it decides the partition, so the owner)`)
	case k[0] != '"':
		return job{}, fmt.Errorf(`"key" must be a JSON string, got %s`, abbreviate(string(k)))
	default:
		var s string
		if err := json.Unmarshal(k, &s); err != nil {
			return job{}, fmt.Errorf(`"key" is not a valid JSON string: %s`, jsonCause(err))
		}
		j.key = []byte(s)
	}
	raw, ok := fields["value"]
	switch v := bytes.TrimSpace(raw); {
	case !ok:
		return job{}, errors.New(`the job has no "value"`)
	case len(v) > 0 && v[0] == '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return job{}, fmt.Errorf(`"value" is not a valid JSON string: %s`, jsonCause(err))
		}
		j.value = []byte(s)
	default:
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			return job{}, fmt.Errorf(`"value" is not valid JSON: %s`, jsonCause(err))
		}
		j.value = buf.Bytes()
	}
	if err := checkJob(j, maxBytes); err != nil {
		return job{}, err
	}
	return j, nil
}

// jsonKind names the JSON value a first token starts.
func jsonKind(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "array"
		}
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "boolean"
	case nil:
		return "null"
	}
	return "value"
}

func jsonCause(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	case errors.As(err, &te) && te.Field == "":
		return "the line is a JSON " + te.Value
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func abbreviate(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}

// production sends jobs and tallies where kgo put them, checking each
// against partition.For.
type production struct {
	topic      string
	partitions int32
	total      int // jobs to produce

	mu       sync.Mutex
	err      error
	acked    int
	byKey    map[string]*keyTally
	byPart   map[int32]*partTally
	mismatch error
}

type keyTally struct {
	partition   int32
	jobs        int
	first, last int64
}

type partTally struct {
	jobs        int
	keys        map[string]struct{}
	first, last int64
}

func newProduction(topic string, partitions int32, total int) *production {
	return &production{topic: topic, partitions: partitions, total: total,
		byKey: map[string]*keyTally{}, byPart: map[int32]*partTally{}}
}

// run produces every job jobs yields and waits for all of them. It stops
// sending at the first failure and reports it with how many jobs were
// acknowledged.
func (p *production) run(ctx context.Context, cl *kgo.Client, jobs func(yield func(job) bool)) error {
	var wg sync.WaitGroup
	sent := 0
	jobs(func(j job) bool {
		p.mu.Lock()
		failed := p.err != nil || p.mismatch != nil
		p.mu.Unlock()
		if failed || ctx.Err() != nil {
			return false
		}
		want := partition.For(j.key, p.partitions)
		wg.Add(1)
		sent++
		cl.Produce(ctx, &kgo.Record{Topic: p.topic, Key: j.key, Value: j.value}, func(r *kgo.Record, err error) {
			defer wg.Done()
			p.record(r, want, err)
		})
		return true
	})
	wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case ctx.Err() != nil && p.acked < p.total:
		// Records cut short by the signal fail with the context's error:
		// that is the interruption, not a broker failure.
		return fmt.Errorf("interrupted after %d of %d jobs were acknowledged, %d sent%s", p.acked, p.total, sent, p.seeAbove())
	case p.err != nil:
		return fmt.Errorf("producing to topic %q failed after %d of %d jobs were acknowledged%s: %v", p.topic, p.acked, p.total, p.seeAbove(), p.err)
	case p.mismatch != nil:
		return p.mismatch
	}
	return nil
}

// progressLine says how far the production is: jobs acknowledged of all,
// the rate so far and an estimate of the time left.
func (p *production) progressLine(elapsed time.Duration) string {
	p.mu.Lock()
	acked := p.acked
	p.mu.Unlock()
	line := fmt.Sprintf("producing to topic %s: %d of %d jobs acknowledged (%d%%)", p.topic, acked, p.total, acked*100/max(p.total, 1))
	if rate := float64(acked) / elapsed.Seconds(); acked > 0 && elapsed > 0 {
		left := time.Duration(float64(p.total-acked) / rate * float64(time.Second))
		line += fmt.Sprintf(", %.0f jobs/s, about %s left", rate, left.Round(time.Second))
	}
	return line
}

// progressDelay is how long a command runs before it shows progress, and
// progressEvery how often it updates it.
const (
	progressDelay = time.Second
	progressEvery = 500 * time.Millisecond
)

// startProgress shows line's answer on w, rewritten in place every
// progressEvery once the command has run for progressDelay, when w is a
// terminal; elsewhere (a pipe, a file) it shows nothing. stop clears the
// line and returns once nothing more is written.
func startProgress(w io.Writer, line func(elapsed time.Duration) string) (stop func()) {
	if !isTerminal(w) {
		return func() {}
	}
	start := time.Now()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		wrote := false
		defer func() {
			if wrote {
				fmt.Fprint(w, "\r\x1b[K")
			}
		}()
		tick.Repeat(quit, progressDelay, progressEvery, func() bool {
			fmt.Fprintf(w, "\r%s\x1b[K", line(time.Since(start)))
			wrote = true
			return true
		})
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit); <-done })
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// seeAbove points at the summary printed for acknowledged jobs, if any.
func (p *production) seeAbove() string {
	if p.acked == 0 {
		return ""
	}
	return " (where they are is on stdout)"
}

func (p *production) record(r *kgo.Record, want int32, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.err == nil {
			p.err = err
		}
		return
	}
	p.acked++
	if r.Partition != want && p.mismatch == nil {
		p.mismatch = fmt.Errorf("the job with key %q went to partition %d but partition.For (murmur2) says %d of %d: the producer's partitioner does not match, or the topic's partition count changed",
			abbreviate(string(r.Key)), r.Partition, want, p.partitions)
	}
	k := string(r.Key)
	kt := p.byKey[k]
	if kt == nil {
		kt = &keyTally{partition: r.Partition, first: r.Offset, last: r.Offset}
		p.byKey[k] = kt
	}
	kt.jobs++
	kt.first, kt.last = min(kt.first, r.Offset), max(kt.last, r.Offset)
	pt := p.byPart[r.Partition]
	if pt == nil {
		pt = &partTally{keys: map[string]struct{}{}, first: r.Offset, last: r.Offset}
		p.byPart[r.Partition] = pt
	}
	pt.jobs++
	pt.keys[k] = struct{}{}
	pt.first, pt.last = min(pt.first, r.Offset), max(pt.last, r.Offset)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func offsetRange(first, last int64) string {
	if first == last {
		return strconv.FormatInt(first, 10)
	}
	return fmt.Sprintf("%d-%d", first, last)
}

// report prints where the jobs went: key by key, or partition by partition.
// interrupted names the signal that stopped the production early, if any.
func (p *production) report(w io.Writer, perKey bool, interrupted string) error {
	switch {
	case interrupted != "":
		fmt.Fprintf(w, "interrupted by %s: %d of %d jobs were acknowledged by topic %s (%s), each on the partition partition.For (murmur2) computes for its key\n",
			interrupted, p.acked, p.total, p.topic, plural(int(p.partitions), "partition"))
	case p.acked < p.total:
		fmt.Fprintf(w, "stopped: %d of %d jobs were acknowledged by topic %s (%s), each on the partition partition.For (murmur2) computes for its key\n",
			p.acked, p.total, p.topic, plural(int(p.partitions), "partition"))
	default:
		fmt.Fprintf(w, "produced %s to topic %s (%s); every job is on the partition partition.For (murmur2) computes for its key\n",
			plural(p.acked, "job"), p.topic, plural(int(p.partitions), "partition"))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if perKey {
		keys := make([]string, 0, len(p.byKey))
		for k := range p.byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintln(tw, "KEY\tPARTITION\tJOBS\tOFFSETS")
		for _, k := range keys {
			t := p.byKey[k]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", printableString(k), t.partition, t.jobs, offsetRange(t.first, t.last))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "PARTITION\tJOBS\tKEYS\tOFFSETS")
	for part := range p.partitions {
		t := p.byPart[part]
		if t == nil {
			fmt.Fprintf(tw, "%d\t0\t0\t-\n", part)
			continue
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", part, t.jobs, len(t.keys), offsetRange(t.first, t.last))
	}
	return tw.Flush()
}
