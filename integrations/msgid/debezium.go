package msgid

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ErrUnsupportedConnector means a Debezium event comes from a connector
// whose source position DebeziumID does not know how to read.
var ErrUnsupportedConnector = errors.New("unsupported Debezium connector")

// DebeziumChange is what DebeziumID reads from a Debezium change event.
type DebeziumChange struct {
	// Connector is source.connector ("postgresql", "mysql", "sqlserver");
	// Name is source.name, the connector's logical server name (topic
	// prefix).
	Connector, Name string
	// Position is the change's place in the database's log, as
	// "field=value" pairs in a fixed order: Postgres "lsn=…" (and
	// "txId=…"); MySQL "gtid=…" if set, "file=…", "pos=…", "row=…"; SQL
	// Server "commit_lsn=…", "change_lsn=…" and "event_serial_no=…" if
	// set.
	Position []string
	// TxID and TxOrder are the transaction block's id and total_order, if
	// the connector emits transaction metadata.
	TxID, TxOrder string
	// Table is db.schema.table (Postgres, SQL Server) or db.table (MySQL).
	Table string
	// Op is the operation: c, u, d, r (snapshot read), t (truncate).
	Op string
	// Snapshot is set for the events of a snapshot (op r, or a
	// source.snapshot other than false): they all carry the position at
	// which the snapshot started.
	Snapshot bool
	// Image is the lower-case hex SHA-256 of the row's before and after
	// images ({"after":…,"before":…} as compact JSON, object keys sorted,
	// numbers as written).
	Image string
}

// MaxDebeziumIDLen bounds DebeziumID's IDs (a namespace accepts 512 bytes
// by default): a longer one is replaced by "dbz:sha256:" and its hash.
const MaxDebeziumIDLen = 256

// DebeziumID derives a stable message ID from a Debezium change event
// value (JSON, with or without the {"schema":…,"payload":…} envelope) and
// its record key (JSON, with or without the envelope; nil, empty or null
// for a table without a key). A connector that restarts re-emits the
// events after its last recorded offset; they carry the same source
// position and row, so they get the same ID, and dedupnode answers
// duplicate.
//
// The ID is built from the connector and its logical server name, the
// source position (Postgres: lsn and txId; MySQL: gtid if present, binlog
// file, pos and row, the row's index within its binlog event; SQL Server:
// commit_lsn, change_lsn and event_serial_no), the transaction block's id
// and total_order if present, the table, the operation, and the record
// key, which tells apart the rows that share a position.
//
// A keyless row (no record key) is told apart by its position where that
// is the row's own: a MySQL binlog event's row index, a SQL Server
// change_lsn and event_serial_no, a Postgres lsn of an update or delete,
// a transaction block's total_order. Where rows share a position — every
// row of a snapshot carries the snapshot's, and the rows that one
// Postgres COPY writes in a single WAL record share its lsn — the ID adds
// "image=sha256:" and the SHA-256 of the row's before and after images
// instead: rows with different contents get different IDs, but identical
// rows of a keyless table read at one position are one ID (nothing in the
// events tells them apart from a re-emission).
//
// Fields that change between emissions of one change (ts_ms, the
// payload's processing time; source.snapshot's first/last markers) are
// left out. A key longer than 128 bytes enters as its SHA-256, and an ID
// longer than MaxDebeziumIDLen is replaced by its SHA-256. Events from
// other connectors fail with ErrUnsupportedConnector; an event missing a
// position field fails naming it. Heartbeats, schema-change events and
// tombstones carry no row change and fail with ErrNoID.
func DebeziumID(key, value []byte) ([]byte, error) {
	if v := bytes.TrimSpace(value); len(v) == 0 || string(v) == "null" {
		// The tombstone Kafka Connect writes after a delete, for log
		// compaction: no change to apply.
		return nil, fmt.Errorf("%w: debezium tombstone (empty value)", ErrNoID)
	}
	ch, err := ParseDebezium(value)
	if err != nil {
		return nil, err
	}
	k, err := canonicalKey(key)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dbz:%s/%s/%s", ch.Connector, ch.Name, strings.Join(ch.Position, ","))
	if ch.TxID != "" {
		fmt.Fprintf(&b, "/tx=%s#%s", ch.TxID, ch.TxOrder)
	}
	fmt.Fprintf(&b, "/%s/%s", ch.Table, ch.Op)
	switch {
	case k != nil:
		if len(k) > 128 {
			sum := sha256.Sum256(k)
			k = []byte("sha256:" + hex.EncodeToString(sum[:]))
		}
		b.WriteString("/")
		b.Write(k)
	case sharedPosition(ch):
		b.WriteString("/image=sha256:" + ch.Image)
	}
	if b.Len() > MaxDebeziumIDLen {
		sum := sha256.Sum256([]byte(b.String()))
		return []byte("dbz:sha256:" + hex.EncodeToString(sum[:])), nil
	}
	return []byte(b.String()), nil
}

// sharedPosition reports whether other rows' events may carry ch's exact
// position (and transaction order), so that a keyless row needs its image
// to be told apart: snapshot reads all carry the snapshot's position, and
// Postgres decodes the rows of one multi-row WAL record (COPY's
// heap_multi_insert) as inserts at that record's lsn. MySQL numbers the
// rows of a binlog event (row) and SQL Server the events of one change
// (event_serial_no); a transaction block numbers every event (total_order).
func sharedPosition(ch DebeziumChange) bool {
	if ch.TxID != "" {
		return false
	}
	return ch.Snapshot || (ch.Connector == "postgresql" && ch.Op == "c")
}

// ParseDebezium reads the fields DebeziumID uses from a Debezium change
// event value.
func ParseDebezium(value []byte) (DebeziumChange, error) {
	var ch DebeziumChange
	v, err := decodeJSON(value)
	if err != nil {
		return ch, fmt.Errorf("debezium event: %w", err)
	}
	ev, ok := v.(map[string]any)
	if !ok {
		return ch, fmt.Errorf("debezium event: want a JSON object, got %s", jsonKind(v))
	}
	ev = unwrapEnvelope(ev)
	srcV, ok := ev["source"]
	if !ok || srcV == nil {
		return ch, fmt.Errorf("%w: debezium event has no source block (a heartbeat, a schema change, or not a change event)", ErrNoID)
	}
	src, ok := srcV.(map[string]any)
	if !ok {
		return ch, fmt.Errorf("debezium event: source is %s, want an object", jsonKind(srcV))
	}
	str := func(obj map[string]any, where, field string, required bool) (string, error) {
		v, ok := obj[field]
		if !ok || v == nil {
			if required {
				return "", fmt.Errorf("debezium event: %s.%s is missing", where, field)
			}
			return "", nil
		}
		switch t := v.(type) {
		case string:
			if t == "" && required {
				return "", fmt.Errorf("debezium event: %s.%s is empty", where, field)
			}
			return t, nil
		case json.Number:
			return t.String(), nil
		}
		return "", fmt.Errorf("debezium event: %s.%s is %s, want a string or a number", where, field, jsonKind(v))
	}
	if ch.Connector, err = str(src, "source", "connector", true); err != nil {
		return ch, err
	}
	if ch.Name, err = str(src, "source", "name", true); err != nil {
		return ch, err
	}
	if ch.Op, err = str(ev, "payload", "op", true); err != nil {
		return ch, err
	}
	pos := func(field string, required bool) error {
		s, err := str(src, "source", field, required)
		if err == nil && s != "" {
			ch.Position = append(ch.Position, field+"="+s)
		}
		return err
	}
	db, err := str(src, "source", "db", false)
	if err != nil {
		return ch, err
	}
	table, err := str(src, "source", "table", false)
	if err != nil {
		return ch, err
	}
	switch ch.Connector {
	case "postgresql":
		schema, err := str(src, "source", "schema", false)
		if err != nil {
			return ch, err
		}
		ch.Table = joinNonEmpty(db, schema, table)
		if err := pos("lsn", true); err != nil {
			return ch, err
		}
		if err := pos("txId", false); err != nil {
			return ch, err
		}
	case "mysql":
		ch.Table = joinNonEmpty(db, table)
		if err := pos("gtid", false); err != nil {
			return ch, err
		}
		if err := pos("file", true); err != nil {
			return ch, err
		}
		if err := pos("pos", true); err != nil {
			return ch, err
		}
		row, err := str(src, "source", "row", false)
		if err != nil {
			return ch, err
		}
		if row == "" {
			row = "0"
		}
		ch.Position = append(ch.Position, "row="+row)
	case "sqlserver":
		schema, err := str(src, "source", "schema", false)
		if err != nil {
			return ch, err
		}
		ch.Table = joinNonEmpty(db, schema, table)
		// A snapshot's events carry only the commit_lsn the snapshot
		// read at; a streamed change has all three.
		if err := pos("commit_lsn", true); err != nil {
			return ch, err
		}
		if err := pos("change_lsn", false); err != nil {
			return ch, err
		}
		if err := pos("event_serial_no", false); err != nil {
			return ch, err
		}
	default:
		return ch, fmt.Errorf("%w: %q (want postgresql, mysql or sqlserver)", ErrUnsupportedConnector, ch.Connector)
	}
	switch s := src["snapshot"].(type) {
	case bool:
		ch.Snapshot = s
	case string:
		// "true", "first", "last", "incremental", …: any but "false".
		ch.Snapshot = s != "" && s != "false"
	}
	ch.Snapshot = ch.Snapshot || ch.Op == "r"
	if txV, ok := ev["transaction"]; ok && txV != nil {
		tx, ok := txV.(map[string]any)
		if !ok {
			return ch, fmt.Errorf("debezium event: transaction is %s, want an object", jsonKind(txV))
		}
		if ch.TxID, err = str(tx, "transaction", "id", true); err != nil {
			return ch, err
		}
		if ch.TxOrder, err = str(tx, "transaction", "total_order", true); err != nil {
			return ch, err
		}
	}
	img, err := canonicalJSON(map[string]any{"before": ev["before"], "after": ev["after"]})
	if err != nil {
		return ch, fmt.Errorf("debezium event: row image: %w", err)
	}
	sum := sha256.Sum256(img)
	ch.Image = hex.EncodeToString(sum[:])
	return ch, nil
}

// unwrapEnvelope returns the payload of a {"schema":…,"payload":…} event
// (the JSON converter with schemas enabled), else the event itself.
func unwrapEnvelope(ev map[string]any) map[string]any {
	if p, ok := ev["payload"].(map[string]any); ok {
		if _, hasSchema := ev["schema"]; hasSchema || len(ev) == 1 {
			return p
		}
	}
	return ev
}

// canonicalKey returns the record key's payload as compact JSON with
// object keys sorted, so that two serialisations of one key match; nil for
// a table without a key (no key, or a null one).
func canonicalKey(key []byte) ([]byte, error) {
	if len(bytes.TrimSpace(key)) == 0 {
		return nil, nil
	}
	v, err := decodeJSON(key)
	if err != nil {
		return nil, fmt.Errorf("debezium key: %w", err)
	}
	if obj, ok := v.(map[string]any); ok {
		if p, hasPayload := obj["payload"]; hasPayload && p == nil && len(obj) == 2 && obj["schema"] == nil {
			// The JSON converter's envelope of a null key.
			return nil, nil
		}
		v = unwrapEnvelope(obj)
	}
	if v == nil {
		return nil, nil
	}
	k, err := canonicalJSON(v)
	if err != nil {
		return nil, fmt.Errorf("debezium key: %w", err)
	}
	return k, nil
}

// canonicalJSON encodes v (from decodeJSON) as compact JSON:
// encoding/json sorts map keys and keeps json.Number literals as written.
func canonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decodeJSON decodes exactly one JSON value, numbers as json.Number.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not JSON: more than one value")
	}
	return v, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

func joinNonEmpty(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}
