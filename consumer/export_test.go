package consumer

import "github.com/jackc/pgx/v5"

// ConnOf gives tests that must reach the batch's connection (to cut it at
// the right moment) what handlers cannot have.
func ConnOf(tx Tx) *pgx.Conn {
	switch t := tx.(type) {
	case *handlerTx:
		return t.tx.Conn()
	case *savepoint:
		return t.tx.Conn()
	}
	return nil
}
