package fence

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCommitFenceSQL pins the commit fences, byte for byte, to the text
// they had when each was a literal of its own: every batch runs one, and
// strictFenceSQL edits pipelinedSQL by string replacement. A deliberate
// change of the SQL updates the sums.
func TestCommitFenceSQL(t *testing.T) {
	s, err := NewStore(new(pgxpool.Pool), "tenure_pin") // NewStore does not touch the pool
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, sql, sum string }{
		{"commitSQL", s.commitSQL, "48f7af9e93f55f7eb20962c54b589317173ca62f636f68da9582cea4e4c260ce"},
		{"pipelinedSQL", s.pipelinedSQL, "d95a5a2bcef8125d29243005e1ecb963bccd706cdc02845fb1439b1e1d28a819"},
		{"strictFenceSQL", s.strictFenceSQL(), "549a39d0293229495505945d375532345ab777c68698bca5583febc82ae00049"},
	} {
		sum := sha256.Sum256([]byte(c.sql))
		if got := hex.EncodeToString(sum[:]); got != c.sum {
			t.Errorf("%s changed: sha256 %s, want %s; the statement is now:\n%s", c.name, got, c.sum, c.sql)
		}
	}
}
