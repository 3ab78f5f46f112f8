package export

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/tenure-dev/tenure/sink"
)

// Position is a job's place: its partition and offset. The pointer of a key
// moves only to a later position of the same partition (docs/export.md).
type Position struct {
	Topic     string
	Partition int32
	Offset    int64
}

func (p Position) String() string { return fmt.Sprintf("%s/%d/%d", p.Topic, p.Partition, p.Offset) }

// ObjectName is a parsed object name.
type ObjectName struct {
	KeyPart  string // the key as written in the name (see keyPart)
	Position Position
	Token    sink.Token
	Scope    string // hex: which schema and group staged it (Scope)
	Nonce    string // hex: unique per staging
}

// Scope identifies the fencing rows that decide an object's fate: those of
// group in schema. It is part of every object name, so that garbage
// collection recognises the objects of its schema's groups and never touches
// anyone else's, even in a shared store.
func Scope(schema, group string) string {
	h := sha256.Sum256([]byte("tenure-export\x00" + schema + "\x00" + group))
	return hex.EncodeToString(h[:8])
}

// Name builds the immutable name an object is staged under:
//
//	objects/<key>/<topic>/<partition>/<offset:020>-<incarnation>.<epoch>-<scope>-<nonce>
//
// The key appears as it is when it is short and made of [A-Za-z0-9._-] (and
// not "." or ".."); otherwise as "=" and the hex of its SHA-256. The nonce
// makes every staging's name new, so that Put never meets an object another
// attempt made, and an object is published by at most one transaction.
func Name(key string, pos Position, token sink.Token, scope, nonce string) string {
	return fmt.Sprintf("%s%s/%s/%d/%020d-%s-%s-%s", objectsDir, keyPart(key), pos.Topic, pos.Partition, pos.Offset, token, scope, nonce)
}

// NewNonce returns a fresh random nonce for Name.
func NewNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

var safeKey = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

func keyPart(key string) string {
	if safeKey.MatchString(key) && key != "." && key != ".." {
		return key
	}
	h := sha256.Sum256([]byte(key))
	return "=" + hex.EncodeToString(h[:20])
}

var fileRE = regexp.MustCompile(`^([0-9]{20})-([0-9]+)\.(-?[0-9]+)-([0-9a-f]{16})-([0-9a-f]{16})$`)

// ErrForeignName is returned by ParseName for a name the sink did not make.
var ErrForeignName = errors.New("export: not an object name of this sink")

// ParseName reads a name made by Name.
func ParseName(name string) (ObjectName, error) {
	rest, ok := strings.CutPrefix(name, objectsDir)
	if !ok {
		return ObjectName{}, ErrForeignName
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" {
		return ObjectName{}, ErrForeignName
	}
	part, err := strconv.ParseInt(parts[2], 10, 32)
	if err != nil || part < 0 || strconv.FormatInt(part, 10) != parts[2] {
		return ObjectName{}, ErrForeignName
	}
	m := fileRE.FindStringSubmatch(parts[3])
	if m == nil {
		return ObjectName{}, ErrForeignName
	}
	off, err1 := strconv.ParseInt(m[1], 10, 64)
	tok, err2 := sink.ParseToken(m[2] + "." + m[3])
	if err1 != nil || err2 != nil || off < 0 {
		return ObjectName{}, ErrForeignName
	}
	return ObjectName{KeyPart: parts[0], Position: Position{Topic: parts[1], Partition: int32(part), Offset: off},
		Token: tok, Scope: m[4], Nonce: m[5]}, nil
}
