package partition_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tenure-dev/tenure/partition"
)

var partitionCounts = []int32{1, 2, 3, 7, 12, 100, 1000}

// Vectors from Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/
// apache/kafka/common/utils/UtilsTest.java).
func TestMurmur2KafkaVectors(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := int32(partition.Murmur2([]byte(c.in))); got != c.want {
			t.Errorf("Murmur2(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

// Expected values were computed with Kafka's Java murmur2 and toPositive.
// The 4-byte keys were solved for (murmur2 is a bijection on 4-byte inputs)
// to hit the sign-bit corner cases.
func TestForVectors(t *testing.T) {
	var (
		hashMinInt32 = []byte{0xa7, 0xd6, 0x50, 0x6c} // murmur2 = 0x80000000
		hashMinus1   = []byte{0xa5, 0xd4, 0x30, 0x5c} // murmur2 = 0xffffffff
		hashMaxInt32 = []byte{0x02, 0x7d, 0x53, 0x43} // murmur2 = 0x7fffffff
	)
	for _, c := range []struct {
		name       string
		key        []byte
		partitions int32
		want       int32
	}{
		// murmur2("21") is negative: toPositive gives 1173551340 (-> 340),
		// abs would give 973932308 (-> 308).
		{"negative hash", []byte("21"), 1000, 340},
		{"negative hash", []byte("21"), 7, 3},
		{"positive hash", []byte("abc"), 1000, 107},
		{"empty key is hashed", []byte{}, 1000, 681},
		{"empty key is hashed", []byte{}, 12, 9},
		// toPositive(MinInt32) is 0; abs(MinInt32) would stay negative.
		{"MinInt32 hash", hashMinInt32, 1000, 0},
		{"MinInt32 hash", hashMinInt32, 7, 0},
		{"-1 hash", hashMinus1, 1000, 647},
		{"-1 hash same as MaxInt32", hashMaxInt32, 1000, 647},
		{"MaxInt32 partitions", hashMaxInt32, math.MaxInt32, 0},
		{"MaxInt32 partitions", hashMinus1, math.MaxInt32, 0},
		{"one partition", []byte("foobar"), 1, 0},
	} {
		if got := partition.For(c.key, c.partitions); got != c.want {
			t.Errorf("%s: For(%x, %d) = %d, want %d", c.name, c.key, c.partitions, got, c.want)
		}
	}
	if h := partition.Murmur2(hashMinInt32); h != 0x80000000 {
		t.Errorf("Murmur2(%x) = %#x, want 0x80000000", hashMinInt32, h)
	}
}

func TestForInvalid(t *testing.T) {
	for _, n := range []int32{0, -1, math.MinInt32} {
		if got := partition.For([]byte("k"), n); got != -1 {
			t.Errorf("For(k, %d) = %d, want -1", n, got)
		}
	}
	if got := partition.For(nil, 12); got != -1 {
		t.Errorf("For(nil, 12) = %d, want -1", got)
	}
}

func TestOf(t *testing.T) {
	for _, c := range []struct {
		key        []byte
		partitions int32
		err        error
	}{
		{nil, 12, partition.ErrNoKey},
		{nil, 0, partition.ErrNoKey},
		{[]byte("k"), 0, partition.ErrNoPartitions},
		{[]byte("k"), -5, partition.ErrNoPartitions},
	} {
		p, err := partition.Of(c.key, c.partitions)
		if !errors.Is(err, c.err) || p != -1 {
			t.Errorf("Of(%q, %d) = %d, %v; want -1, %v", c.key, c.partitions, p, err, c.err)
		}
	}
	for _, n := range partitionCounts {
		p, err := partition.Of([]byte("foobar"), n)
		if err != nil || p != partition.For([]byte("foobar"), n) {
			t.Errorf("Of(foobar, %d) = %d, %v; want %d, nil", n, p, err, partition.For([]byte("foobar"), n))
		}
	}
}

// kgoPicker reports the partition franz-go chooses for a keyed record, both
// with StickyKeyPartitioner(nil) and with kgo's default partitioner.
type kgoPicker struct {
	sticky, def kgo.TopicPartitioner
}

func newKgoPicker() kgoPicker {
	return kgoPicker{
		sticky: kgo.StickyKeyPartitioner(nil).ForTopic("t"),
		// Same arguments kgo uses for its default partitioner.
		def: kgo.UniformBytesPartitioner(64<<10, true, true, nil).ForTopic("t"),
	}
}

func (k kgoPicker) check(t *testing.T, key []byte, n int32) {
	t.Helper()
	got := partition.For(key, n)
	if got < 0 || got >= n {
		t.Fatalf("For(%x, %d) = %d, out of range", key, n, got)
	}
	r := &kgo.Record{Key: key}
	if want := int32(k.sticky.Partition(r, int(n))); got != want {
		t.Fatalf("For(%x, %d) = %d, kgo StickyKeyPartitioner = %d", key, n, got, want)
	}
	def := k.def.(kgo.TopicBackupPartitioner)
	if want := int32(def.PartitionByBackup(r, int(n), &backupIter{n: int(n)})); got != want {
		t.Fatalf("For(%x, %d) = %d, kgo default partitioner = %d", key, n, got, want)
	}
}

// backupIter reports no buffered records; keyed records ignore it anyway.
type backupIter struct{ i, n int }

func (b *backupIter) Next() (int, int64) { b.i++; return b.i - 1, 0 }
func (b *backupIter) Rem() int           { return b.n - b.i }

func TestForMatchesKgo(t *testing.T) {
	k := newKgoPicker()
	rng := rand.New(rand.NewPCG(1, 2)) // fixed seed: failures reproduce
	for i := range 5000 {
		key := make([]byte, i%300) // every tail length, empty included
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		for _, n := range partitionCounts {
			k.check(t, key, n)
		}
		k.check(t, key, 1+rng.Int32N(math.MaxInt32))
	}
}

func FuzzFor(f *testing.F) {
	f.Add([]byte("21"), uint32(1000))
	f.Add([]byte{}, uint32(12))
	f.Add([]byte{0xa7, 0xd6, 0x50, 0x6c}, uint32(7))
	f.Add([]byte("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), uint32(9999))
	k := newKgoPicker()
	f.Fuzz(func(t *testing.T, key []byte, p uint32) {
		n := 1 + int32(p%10000)
		if key == nil { // not keyed: kgo would pick a sticky partition
			if got := partition.For(key, n); got != -1 {
				t.Fatalf("For(nil, %d) = %d, want -1", n, got)
			}
			return
		}
		k.check(t, key, n)
	})
}

func BenchmarkFor(b *testing.B) {
	for _, size := range []int{16, 256} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			key := make([]byte, size)
			for i := range key {
				key[i] = byte(i)
			}
			b.SetBytes(int64(size))
			var sink int32
			for b.Loop() {
				sink += partition.For(key, 12)
			}
			_ = sink
		})
	}
}

func ExampleFor() {
	fmt.Println(partition.For([]byte("job-42"), 12))
	fmt.Println(partition.For([]byte("job-42"), 0))
	// Output:
	// 1
	// -1
}

func ExampleOf() {
	_, err := partition.Of(nil, 12)
	fmt.Println(err)
	_, err = partition.Of([]byte("job-42"), 0)
	fmt.Println(err)
	// Output:
	// partition: nil key (tenure jobs must have a key)
	// partition: partition count must be positive, got 0
}
