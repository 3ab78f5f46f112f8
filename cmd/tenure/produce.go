package main

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
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
)

func init() {
	register(command{name: "produce", summary: "produce jobs (key + value) to a topic, keyed like the Java client (murmur2)", run: runProduce})
}

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

func runProduce(ctx context.Context, e *env, args []string) error {
	f := newFlagSet(e, "produce", "--brokers HOST:PORT[,..] --topic T (--key K --value V | --input FILE|- | --generate N [--keys K]) [--max-bytes N]")
	brokers := f.String("brokers", "", "Kafka seed brokers, comma separated")
	topic := f.String("topic", "", "topic to produce to (it must exist: see `tenure admin topic create`)")
	key := f.String("key", "", "the job's key: it decides the partition, so the owner")
	value := f.String("value", "", "the job's value (with --key)")
	input := f.String("input", "", `file of JSON lines {"key": "...", "value": ...}, or - for stdin; a string value is produced as its raw bytes, any other JSON value as compact JSON`)
	generate := f.Int("generate", 0, "produce N demo jobs, keys key-0..key-(K-1), values {\"seq\":i}")
	nkeys := f.Int("keys", 10, "number of distinct keys with --generate")
	maxBytes := f.Int("max-bytes", defaultMaxJobBytes, "largest job accepted (key + value bytes); larger ones are refused before anything is produced")
	if err := f.parse(args, 0); err != nil {
		return err
	}
	if err := required("brokers", *brokers, "topic", *topic); err != nil {
		return err
	}
	if strings.Contains(*topic, ",") {
		return usagef("--topic takes one topic, got %q", *topic)
	}
	modes := 0
	for _, set := range []bool{*key != "" || *value != "", *input != "", *generate != 0} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return usagef("give exactly one of --key K --value V, --input FILE|-, or --generate N")
	}
	if *value != "" && *key == "" {
		return usagef("--value needs --key: tenure jobs must have a key")
	}
	if *key != "" && *value == "" {
		return usagef("--key needs --value")
	}
	if *generate < 0 {
		return usagef("--generate must be at least 1")
	}
	if *nkeys < 1 {
		return usagef("--keys must be at least 1")
	}
	if *maxBytes < 1 {
		return usagef("--max-bytes must be at least 1")
	}

	// Everything is read and validated before anything is sent: a bad job
	// anywhere in the input produces nothing.
	var jobs []job
	switch {
	case *key != "":
		j := job{key: []byte(*key), value: []byte(*value)}
		if err := checkJob(j, *maxBytes); err != nil {
			return fmt.Errorf("%s; nothing was produced", err)
		}
		jobs = []job{j}
	case *input != "":
		var err error
		jobs, err = readJobs(e.stdin, *input, *maxBytes)
		if err != nil {
			return err
		}
		if len(jobs) == 0 {
			return fmt.Errorf("%s has no jobs; nothing was produced", inputName(*input))
		}
	}

	brokerList := splitList(*brokers)
	largest := 0
	for _, j := range jobs {
		largest = max(largest, len(j.key)+len(j.value))
	}
	cl, err := producerClient(brokerList, largest)
	if err != nil {
		return err
	}
	defer cl.Close()
	counts, err := checkTopics(ctx, cl, brokerList, []string{*topic})
	if err != nil {
		return err
	}
	n := counts[*topic]

	p := newProduction(*topic, n)
	if *generate > 0 {
		err = p.run(ctx, cl, func(yield func(job) bool) {
			for i := range *generate {
				k := "key-" + strconv.Itoa(i%*nkeys)
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
	if err != nil {
		return err
	}
	perKey := *generate == 0 && len(p.byKey) <= perKeyListMax
	return p.report(e.stdout, perKey)
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
// else as compact JSON).
func parseJobLine(b []byte, maxBytes int) (job, error) {
	var raw struct {
		Key   json.RawMessage `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return job{}, fmt.Errorf(`not a JSON object {"key": "...", "value": ...}: %s`, jsonCause(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return job{}, errors.New("unexpected data after the JSON object (one job per line)")
	}
	var j job
	switch k := bytes.TrimSpace(raw.Key); {
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
	switch v := bytes.TrimSpace(raw.Value); {
	case raw.Value == nil:
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

func newProduction(topic string, partitions int32) *production {
	return &production{topic: topic, partitions: partitions,
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
	case p.err != nil:
		return fmt.Errorf("producing to topic %q failed after %d of %d jobs were acknowledged: %v", p.topic, p.acked, sent, p.err)
	case p.mismatch != nil:
		return p.mismatch
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted after %d of %d jobs were acknowledged", p.acked, sent)
	}
	return nil
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
func (p *production) report(w io.Writer, perKey bool) error {
	fmt.Fprintf(w, "produced %s to topic %s (%d partitions); every job is on the partition partition.For (murmur2) computes for its key\n",
		plural(p.acked, "job"), p.topic, p.partitions)
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
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", k, t.partition, t.jobs, offsetRange(t.first, t.last))
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
