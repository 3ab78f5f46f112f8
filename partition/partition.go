package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var (
	// ErrNoKey is returned by [Of] for a nil key: Kafka does not partition
	// null-key records by key, so there is no partition to compute.
	ErrNoKey = errors.New("partition: nil key (tenure jobs must have a key)")

	// ErrNoPartitions is returned by [Of] when the partition count is not
	// positive.
	ErrNoPartitions = errors.New("partition: partition count must be positive")
)

// For returns the partition in [0, partitions) that Kafka's Java producer and
// franz-go's default partitioner choose for key.
//
// For returns -1 if key is nil or partitions <= 0. It does not panic, since
// bad input (say, metadata reporting zero partitions) should not crash a
// worker; -1 is never a valid partition (Kafka uses it for "unknown
// partition"), so callers can test for it. Use [Of] to get the reason as an
// error.
func For(key []byte, partitions int32) int32 {
	if key == nil || partitions <= 0 {
		return -1
	}
	// Java's Utils.toPositive: clear the sign bit. Not abs, since
	// abs(MinInt32) is still negative.
	return int32(Murmur2(key)&0x7fffffff) % partitions
}

// Of is like [For] but reports a nil key ([ErrNoKey]) or a non-positive
// partition count ([ErrNoPartitions]) as an error, returning -1 with it.
func Of(key []byte, partitions int32) (int32, error) {
	if key == nil {
		return -1, ErrNoKey
	}
	if partitions <= 0 {
		return -1, fmt.Errorf("%w, got %d", ErrNoPartitions, partitions)
	}
	return For(key, partitions), nil
}

// Murmur2 is Kafka's murmur2 hash (Java's Utils.murmur2, whose int result is
// the same 32 bits as this uint32). A nil b hashes like an empty one.
func Murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for ; len(b) >= 4; b = b[4:] {
		k := binary.LittleEndian.Uint32(b)
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
