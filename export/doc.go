// Package export is tenure's protocol for replaceable exports: each job's output
// is staged in an object store under an immutable, generation-specific name,
// and the key's visible pointer moves in the same fenced Postgres
// transaction that commits the job's offset.
//
//   - Staging (ObjectStore.Put) is create-only: a file store writes a staging
//     file, fsyncs it, links it to the object's name (never replacing one)
//     and fsyncs the directory; an S3 store sends one PutObject with
//     If-None-Match: *. Readers never see a half-written object.
//   - The name (Name) carries the key, the job's position (topic, partition,
//     offset), the token it was staged under, the schema and group it
//     belongs to (Scope) and a nonce: every staging makes a new name.
//   - Publishing is a row in Postgres: export_pointers holds, per key, the
//     object, its size and SHA-256, the job and its token. Handler moves it
//     only forward (to a later offset of the same partition), whatever the
//     order in which writers arrive, and only inside the batch's transaction,
//     which the fence commits or rolls back whole. A superseded worker's
//     object may be staged; it is never published.
//   - GC deletes the objects no pointer names and no transaction can still
//     publish, and is safe while workers run.
//   - Get reads a key's visible bytes and checks them against the SHA-256
//     recorded at publication.
//
// The design note, with the garbage collector's reasoning, is docs/export.md
// in the repository.
package export
