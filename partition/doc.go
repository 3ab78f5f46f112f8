// Package partition computes which Kafka partition a tenure job key lands on.
//
// tenure keys jobs onto Kafka partitions: every job with the same key lands
// on the same partition and so has exactly one owner, the consumer holding
// that partition. That only holds while every producer agrees on the
// key-to-partition mapping and the partition count does not change (adding
// partitions moves keys, and so moves ownership).
//
// # The mapping
//
// [For] reproduces Kafka's Java producer for keyed records,
//
//	Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions
//
// which is also what franz-go does by default (its default partitioner and
// kgo.StickyKeyPartitioner(nil) hash keys with murmur2 via kgo.KafkaHasher).
// toPositive clears the sign bit (h & 0x7fffffff); it is not an absolute
// value. The key is the serialized key bytes as they go on the wire.
//
// # Pitfall: librdkafka-based producers
//
// librdkafka's default partitioner, "consistent_random", hashes keys with
// CRC32, not murmur2. A job produced by a librdkafka-based client
// (confluent-kafka-go, confluent-kafka-python, kcat, ...) with default
// settings may therefore land on a different partition than the same key
// produced by Java or franz-go, and get a second owner. Configure such
// producers with
//
//	partitioner=murmur2_random
//
// which matches the Java producer for non-null keys. Likewise, a Java
// producer must not set partitioner.ignore.keys=true or use a custom
// partitioner.
//
// # Keys are required
//
// Every tenure job must have a key. A null key is not keyed at all: the Java
// producer and franz-go spread null-key records with a sticky/random
// partitioner, so no partition can be computed for them. [For] returns -1 and
// [Of] returns [ErrNoKey] for a nil key. An empty but non-nil key, by
// contrast, is hashed like any other key (murmur2 of zero bytes). Still use
// non-empty keys: librdkafka's consistent_random partitions empty keys
// randomly, and not every client keeps an empty key distinct from a null one.
package partition
