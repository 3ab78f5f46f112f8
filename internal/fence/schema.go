package fence

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the Postgres schema tenure's tables live in unless told
// otherwise.
const DefaultSchema = "tenure"

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks that name is a plain lower-case Postgres identifier.
// Names are validated, then quoted anyway: never interpolated unchecked.
func ValidateSchema(name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("schema name %q is not valid: use 1-63 lower-case letters, digits and underscores, not starting with a digit", name)
	}
	if strings.HasPrefix(name, "pg_") || name == "information_schema" {
		return fmt.Errorf("schema name %q is reserved by PostgreSQL", name)
	}
	return nil
}

// quote returns the schema as a quoted SQL identifier.
func quote(schema string) string { return pgx.Identifier{schema}.Sanitize() }
