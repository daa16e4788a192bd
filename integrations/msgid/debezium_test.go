package msgid

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
)

// Debezium-shaped events as the JSON converter writes them, after the
// Debezium tutorial's inventory database.

const pgSource = `{"version":"2.5.0.Final","connector":"postgresql","name":"dbserver1","ts_ms":1701423000000,` +
	`"snapshot":"false","db":"inventory","sequence":"[\"24023064\",\"24023128\"]","schema":"public",` +
	`"table":"customers","txId":556,"lsn":24023128,"xmin":null}`

// pgEvent is an update of customer 1004 without the schema envelope;
// processedAt is the payload's ts_ms (the connector's processing time,
// different on every emission).
func pgEvent(source, processedAt string) string {
	return `{"before":{"id":1004,"first_name":"Anne","email":"annek@noanswer.org"},` +
		`"after":{"id":1004,"first_name":"Anne Marie","email":"annek@noanswer.org"},` +
		`"source":` + source + `,"op":"u","ts_ms":` + processedAt + `,"transaction":null}`
}

func envelope(payload string) string {
	return `{"schema":{"type":"struct","fields":[{"type":"struct","optional":true,"field":"before"}],` +
		`"optional":false,"name":"dbserver1.inventory.customers.Envelope"},"payload":` + payload + `}`
}

const mysqlSource = `{"version":"2.5.0.Final","connector":"mysql","name":"mysql-server-1","ts_ms":1701423100000,` +
	`"snapshot":"false","db":"inventory","sequence":null,"table":"customers","server_id":223344,` +
	`"gtid":null,"file":"mysql-bin.000003","pos":805,"row":0,"thread":7,"query":null}`

func mysqlEvent(source, processedAt string) string {
	return `{"before":null,"after":{"id":1005,"first_name":"Sarah","email":"sarah@example.com"},` +
		`"source":` + source + `,"op":"c","ts_ms":` + processedAt + `}`
}

func mustID(t *testing.T, key, value string) string {
	t.Helper()
	var k []byte
	if key != "" {
		k = []byte(key)
	}
	id, err := DebeziumID(k, []byte(value))
	if err != nil {
		t.Fatalf("DebeziumID(%s, %s): %v", key, value, err)
	}
	return string(id)
}

// A connector that restarts re-emits events after its last recorded
// offset: same source block, a new processing time. They get the same ID,
// with or without the schema envelope on value and key.
func TestDebeziumIDStableAcrossReEmission(t *testing.T) {
	for _, tc := range []struct {
		name       string
		first, re  string
		key, rekey string
		want       string
	}{
		{"postgres", pgEvent(pgSource, "1701423000123"), pgEvent(pgSource, "1701423999999"),
			`{"id":1004}`, `{"id":1004}`,
			`dbz:postgresql/dbserver1/lsn=24023128,txId=556/inventory.public.customers/u/{"id":1004}`},
		{"postgres with envelope", envelope(pgEvent(pgSource, "1701423000123")), pgEvent(pgSource, "1701423999999"),
			`{"schema":{"type":"struct","fields":[{"type":"int32","field":"id"}]},"payload":{"id":1004}}`, `{"id":1004}`,
			`dbz:postgresql/dbserver1/lsn=24023128,txId=556/inventory.public.customers/u/{"id":1004}`},
		{"mysql", mysqlEvent(mysqlSource, "1701423100200"), envelope(mysqlEvent(mysqlSource, "1701423555555")),
			`{"id":1005}`, `{"schema":{"type":"struct"},"payload":{"id":1005}}`,
			`dbz:mysql/mysql-server-1/file=mysql-bin.000003,pos=805,row=0/inventory.customers/c/{"id":1005}`},
		{"mysql, no key", mysqlEvent(mysqlSource, "1"), mysqlEvent(mysqlSource, "2"), "", "",
			`dbz:mysql/mysql-server-1/file=mysql-bin.000003,pos=805,row=0/inventory.customers/c`},
	} {
		a, b := mustID(t, tc.key, tc.first), mustID(t, tc.rekey, tc.re)
		if a != b {
			t.Errorf("%s: re-emitted event got another ID:\n %s\n %s", tc.name, a, b)
		}
		if a != tc.want {
			t.Errorf("%s: ID %s, want %s", tc.name, a, tc.want)
		}
	}
}

// Different changes get different IDs: another LSN, another transaction,
// another binlog position or row, another table, key or operation.
func TestDebeziumIDDistinguishesChanges(t *testing.T) {
	base := mustID(t, `{"id":1004}`, pgEvent(pgSource, "1"))
	for name, ev := range map[string]string{
		"lsn":    pgEvent(strings.Replace(pgSource, `"lsn":24023128`, `"lsn":24023200`, 1), "1"),
		"txId":   pgEvent(strings.Replace(pgSource, `"txId":556`, `"txId":557`, 1), "1"),
		"table":  pgEvent(strings.Replace(pgSource, `"table":"customers"`, `"table":"orders"`, 1), "1"),
		"schema": pgEvent(strings.Replace(pgSource, `"schema":"public"`, `"schema":"archive"`, 1), "1"),
		"name":   pgEvent(strings.Replace(pgSource, `"name":"dbserver1"`, `"name":"dbserver2"`, 1), "1"),
		"op":     strings.Replace(pgEvent(pgSource, "1"), `"op":"u"`, `"op":"d"`, 1),
	} {
		if id := mustID(t, `{"id":1004}`, ev); id == base {
			t.Errorf("another %s, same ID %s", name, id)
		}
	}
	if id := mustID(t, `{"id":1005}`, pgEvent(pgSource, "1")); id == base {
		t.Errorf("another key, same ID %s", id)
	}

	mbase := mustID(t, "", mysqlEvent(mysqlSource, "1"))
	seen := map[string]string{mbase: "base"}
	for name, src := range map[string]string{
		"pos":  strings.Replace(mysqlSource, `"pos":805`, `"pos":1021`, 1),
		"file": strings.Replace(mysqlSource, `"file":"mysql-bin.000003"`, `"file":"mysql-bin.000004"`, 1),
		"row":  strings.Replace(mysqlSource, `"row":0`, `"row":1`, 1),
		"gtid": strings.Replace(mysqlSource, `"gtid":null`, `"gtid":"3E11FA47-71CA-11E1-9E33-C80AA9429562:23"`, 1),
	} {
		id := mustID(t, "", mysqlEvent(src, "1"))
		if other, dup := seen[id]; dup {
			t.Errorf("another %s, same ID as %s: %s", name, other, id)
		}
		seen[id] = name
	}
	gtid := mustID(t, "", mysqlEvent(strings.Replace(mysqlSource, `"gtid":null`, `"gtid":"3E11FA47-71CA-11E1-9E33-C80AA9429562:23"`, 1), "1"))
	if !strings.Contains(gtid, "gtid=3E11FA47-71CA-11E1-9E33-C80AA9429562:23,file=mysql-bin.000003,pos=805,row=0") {
		t.Errorf("gtid ID %s lacks the gtid before the binlog position", gtid)
	}
}

// With transaction metadata, the transaction's id and the event's order in
// it enter the ID.
func TestDebeziumIDTransactionBlock(t *testing.T) {
	ev := func(order string) string {
		return strings.Replace(pgEvent(pgSource, "1"), `"transaction":null`,
			`"transaction":{"id":"556:24023128","total_order":`+order+`,"data_collection_order":1}`, 1)
	}
	a, b := mustID(t, "", ev("1")), mustID(t, "", ev("2"))
	if a == b || !strings.Contains(a, "/tx=556:24023128#1/") {
		t.Fatalf("transaction IDs %s, %s", a, b)
	}
	if a != mustID(t, "", envelope(ev("1"))) {
		t.Fatal("envelope changed the transaction ID")
	}
}

func TestDebeziumIDErrors(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        string
		is          error
	}{
		{"not JSON", `{"source":`, "not JSON", nil},
		{"two values", `{} {}`, "more than one value", nil},
		{"array", `[]`, "want a JSON object", nil},
		{"heartbeat", `{"ts_ms":1701423000000}`, "no source block", ErrNoID},
		{"tombstone", ``, "tombstone", ErrNoID},
		{"null tombstone", `null`, "tombstone", ErrNoID},
		{"no lsn", pgEvent(strings.Replace(pgSource, `"lsn":24023128`, `"lsn":null`, 1), "1"), "source.lsn is missing", nil},
		{"no binlog pos", mysqlEvent(strings.Replace(mysqlSource, `"pos":805,`, ``, 1), "1"), "source.pos is missing", nil},
		{"bad file", mysqlEvent(strings.Replace(mysqlSource, `"file":"mysql-bin.000003"`, `"file":{}`, 1), "1"), "source.file is an object", nil},
		{"no op", strings.Replace(pgEvent(pgSource, "1"), `"op":"u",`, ``, 1), "payload.op is missing", nil},
		{"no connector", pgEvent(strings.Replace(pgSource, `"connector":"postgresql",`, ``, 1), "1"), "source.connector is missing", nil},
		{"mongodb", pgEvent(strings.Replace(pgSource, `"connector":"postgresql"`, `"connector":"mongodb"`, 1), "1"), `"mongodb"`, ErrUnsupportedConnector},
		{"sqlserver without commit_lsn", sqlServerEvent(strings.Replace(sqlServerSource, `"commit_lsn":"00000027:00000758:0005",`, ``, 1), `{"id":1}`, "c", "1"), "source.commit_lsn is missing", nil},
		{"bad transaction", strings.Replace(pgEvent(pgSource, "1"), `"transaction":null`, `"transaction":{"id":"1"}`, 1), "transaction.total_order is missing", nil},
	} {
		_, err := DebeziumID(nil, []byte(tc.value))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: error %v is not %v", tc.name, err, tc.is)
		}
	}
	if _, err := DebeziumID([]byte(`nope`), []byte(pgEvent(pgSource, "1"))); err == nil || !strings.Contains(err.Error(), "debezium key") {
		t.Errorf("bad key: %v", err)
	}
	if _, err := DebeziumID([]byte(`{"id":1} {}`), []byte(pgEvent(pgSource, "1"))); err == nil || !strings.Contains(err.Error(), "debezium key") {
		t.Errorf("bad key: %v", err)
	}
}

// A long key enters as its hash, and a long ID is hashed whole: IDs stay
// within MaxDebeziumIDLen.
func TestDebeziumIDBounded(t *testing.T) {
	long := `{"id":"` + strings.Repeat("k", 300) + `"}`
	id := mustID(t, long, pgEvent(pgSource, "1"))
	if !strings.Contains(id, "/sha256:") || len(id) > MaxDebeziumIDLen {
		t.Fatalf("long key: ID %s", id)
	}
	src := strings.Replace(pgSource, `"table":"customers"`, `"table":"`+strings.Repeat("t", 300)+`"`, 1)
	id = mustID(t, "", pgEvent(src, "1"))
	if !strings.HasPrefix(id, "dbz:sha256:") || len(id) > MaxDebeziumIDLen {
		t.Fatalf("long table: ID %s", id)
	}
}

func FuzzDebeziumID(f *testing.F) {
	f.Add([]byte(`{"id":1004}`), []byte(pgEvent(pgSource, "1")))
	f.Add([]byte(nil), []byte(envelope(mysqlEvent(mysqlSource, "2"))))
	f.Add([]byte(`{"payload":{"id":1}}`), []byte(strings.Replace(pgEvent(pgSource, "1"), `"transaction":null`, `"transaction":{"id":"5","total_order":1}`, 1)))
	f.Add([]byte(`1`), []byte(`{"payload":{"source":{"connector":"mysql","name":"x","file":"f","pos":1},"op":"c"}}`))
	f.Add([]byte(``), []byte(`{"source":null}`))
	f.Add([]byte(`null`), []byte(keylessEvent(pgSnapshotSource, "r", "null", auditRow(1), "1")))
	f.Add([]byte(`{"schema":null,"payload":null}`), []byte(sqlServerEvent(sqlServerSnapshotSource, auditRow(2), "r", "1")))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		id, err := DebeziumID(key, value)
		if err != nil {
			if id != nil {
				t.Fatalf("error %v with an ID %q", err, id)
			}
			return
		}
		if len(id) == 0 || len(id) > MaxDebeziumIDLen || !strings.HasPrefix(string(id), "dbz:") {
			t.Fatalf("ID %q", id)
		}
		again, err := DebeziumID(key, value)
		if err != nil || string(again) != string(id) {
			t.Fatalf("not deterministic: %q then %q, %v", id, again, err)
		}
	})
}

// Source blocks of keyless tables (no primary key: the record key is
// null), as each connector writes them.
const (
	// A Postgres snapshot: every row carries the snapshot's lsn and txId.
	pgSnapshotSource = `{"version":"2.5.0.Final","connector":"postgresql","name":"dbserver1","ts_ms":1701423000000,` +
		`"snapshot":"true","db":"inventory","sequence":"[null,\"24023064\"]","schema":"public",` +
		`"table":"audit_log","txId":555,"lsn":24023064,"xmin":null}`
	// A Postgres COPY: the rows of one multi-insert WAL record share its lsn.
	pgCopySource = `{"version":"2.5.0.Final","connector":"postgresql","name":"dbserver1","ts_ms":1701423000500,` +
		`"snapshot":"false","db":"inventory","sequence":"[\"24023064\",\"24031512\"]","schema":"public",` +
		`"table":"audit_log","txId":561,"lsn":24031512,"xmin":null}`
	// A MySQL snapshot: every row carries the binlog position read when
	// the snapshot began, row 0.
	mysqlSnapshotSource = `{"version":"2.5.0.Final","connector":"mysql","name":"mysql-server-1","ts_ms":1701423100000,` +
		`"snapshot":"true","db":"inventory","sequence":null,"table":"audit_log","server_id":0,` +
		`"gtid":null,"file":"mysql-bin.000003","pos":157,"row":0,"thread":null,"query":null}`
	// SQL Server streaming: the change's commit_lsn and change_lsn, and
	// event_serial_no for the events of one change.
	sqlServerSource = `{"version":"2.5.0.Final","connector":"sqlserver","name":"server1","ts_ms":1701423200000,` +
		`"snapshot":"false","db":"testDB","sequence":null,"schema":"dbo","table":"audit_log",` +
		`"change_lsn":"00000027:00000758:0003","commit_lsn":"00000027:00000758:0005","event_serial_no":1}`
	// A SQL Server snapshot: only the commit_lsn the snapshot read at.
	sqlServerSnapshotSource = `{"version":"2.5.0.Final","connector":"sqlserver","name":"server1","ts_ms":1701423200000,` +
		`"snapshot":"true","db":"testDB","sequence":null,"schema":"dbo","table":"audit_log",` +
		`"change_lsn":null,"commit_lsn":"00000027:00000758:0005","event_serial_no":null}`
)

// auditRow is row i of a keyless audit_log table.
func auditRow(i int) string {
	return fmt.Sprintf(`{"actor":"user-%d","action":"login","at":%d}`, i%37, 1701423000000+int64(i))
}

func keylessEvent(source, op, before, after, processedAt string) string {
	return `{"before":` + before + `,"after":` + after + `,"source":` + source +
		`,"op":"` + op + `","ts_ms":` + processedAt + `,"transaction":null}`
}

func sqlServerEvent(source, after, op, processedAt string) string {
	return keylessEvent(source, op, "null", after, processedAt)
}

// A table without a primary key: 1,000 rows read or written at one
// source position get 1,000 IDs, and an event redelivered — with a new
// processing time, with or without the envelope, re-serialised with its
// fields in another order, with a null key — gets its own ID again.
func TestDebeziumIDKeylessRowsAtOnePosition(t *testing.T) {
	const rows = 1000
	for _, tc := range []struct {
		name  string
		event func(i int, processedAt string) string
	}{
		{"postgres snapshot", func(i int, at string) string {
			return keylessEvent(pgSnapshotSource, "r", "null", auditRow(i), at)
		}},
		{"postgres COPY", func(i int, at string) string {
			return keylessEvent(pgCopySource, "c", "null", auditRow(i), at)
		}},
		{"mysql snapshot", func(i int, at string) string {
			return keylessEvent(mysqlSnapshotSource, "r", "null", auditRow(i), at)
		}},
		{"mysql rows of one binlog event", func(i int, at string) string {
			// One UPDATE … WHERE statement: one rows event, row i of it.
			src := strings.Replace(mysqlSource, `"row":0`, fmt.Sprintf(`"row":%d`, i), 1)
			src = strings.Replace(src, `"table":"customers"`, `"table":"audit_log"`, 1)
			return keylessEvent(src, "u", auditRow(i), strings.Replace(auditRow(i), "login", "logout", 1), at)
		}},
		{"sqlserver events of one change", func(i int, at string) string {
			src := strings.Replace(sqlServerSource, `"event_serial_no":1`, fmt.Sprintf(`"event_serial_no":%d`, i+1), 1)
			return sqlServerEvent(src, auditRow(i), "c", at)
		}},
		{"sqlserver snapshot", func(i int, at string) string {
			return sqlServerEvent(sqlServerSnapshotSource, auditRow(i), "r", at)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := make(map[string]int, rows)
			for i := range rows {
				ev := tc.event(i, "1701423999000")
				id := mustID(t, "", ev)
				if j, dup := ids[id]; dup {
					t.Fatalf("rows %d and %d got one ID %s", j, i, id)
				}
				ids[id] = i
				if i%97 != 0 {
					continue // redeliveries of a sample of the rows, to keep the test quick
				}
				for name, again := range map[string]string{
					"new processing time": tc.event(i, "1701424999999"),
					"envelope":            envelope(tc.event(i, "1701424999999")),
					"fields reordered":    reorder(t, ev),
				} {
					for _, key := range []string{"", "null", `{"schema":null,"payload":null}`} {
						if got := mustID(t, key, again); got != id {
							t.Fatalf("row %d redelivered (%s, key %q): ID %s, first %s", i, name, key, got, id)
						}
					}
				}
			}
		})
	}
}

// reorder re-serialises a JSON event with its object fields in reverse
// order and spaces between tokens, as another converter might.
func reorder(t *testing.T, ev string) string {
	t.Helper()
	v, err := decodeJSON([]byte(ev))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	var write func(v any)
	write = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Sort(sort.Reverse(sort.StringSlice(keys)))
			b.WriteString("{ ")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(" , ")
				}
				fmt.Fprintf(&b, "%q : ", k)
				write(x[k])
			}
			b.WriteString(" }")
		default:
			out, err := json.Marshal(x)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(out)
		}
	}
	write(v)
	return b.String()
}

// Where the position is the keyless row's own, the ID is the position's,
// as before rows were told apart by their images: MySQL streamed rows,
// Postgres updates and deletes, SQL Server streamed changes, and any row
// of a transaction that numbers its events (total_order).
func TestDebeziumIDKeylessOwnPosition(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"mysql streamed", mysqlEvent(mysqlSource, "1"),
			`dbz:mysql/mysql-server-1/file=mysql-bin.000003,pos=805,row=0/inventory.customers/c`},
		{"postgres update", keylessEvent(pgCopySource, "u", auditRow(1), auditRow(2), "1"),
			`dbz:postgresql/dbserver1/lsn=24031512,txId=561/inventory.public.audit_log/u`},
		{"postgres insert in a transaction block", strings.Replace(keylessEvent(pgCopySource, "c", "null", auditRow(1), "1"),
			`"transaction":null`, `"transaction":{"id":"561:24031512","total_order":7,"data_collection_order":7}`, 1),
			`dbz:postgresql/dbserver1/lsn=24031512,txId=561/tx=561:24031512#7/inventory.public.audit_log/c`},
		{"sqlserver streamed", sqlServerEvent(sqlServerSource, auditRow(1), "c", "1"),
			`dbz:sqlserver/server1/commit_lsn=00000027:00000758:0005,change_lsn=00000027:00000758:0003,event_serial_no=1/testDB.dbo.audit_log/c`},
	} {
		if id := mustID(t, "", tc.value); id != tc.want {
			t.Errorf("%s: ID %s, want %s", tc.name, id, tc.want)
		}
	}
}

// A keyless row at a shared position is told apart by its contents:
// identical rows read at one snapshot position share an ID (documented),
// a row's other image gets another, and a keyed row's ID does not depend
// on its image.
func TestDebeziumIDKeylessImage(t *testing.T) {
	a := mustID(t, "", keylessEvent(pgSnapshotSource, "r", "null", auditRow(1), "1"))
	want := "dbz:postgresql/dbserver1/lsn=24023064,txId=555/inventory.public.audit_log/r/image=sha256:"
	if !strings.HasPrefix(a, want) || len(a) != len(want)+64 {
		t.Fatalf("ID %s, want %s and a SHA-256", a, want)
	}
	if b := mustID(t, "", keylessEvent(pgSnapshotSource, "r", "null", auditRow(1), "2")); b != a {
		t.Errorf("identical rows: IDs %s, %s", a, b)
	}
	// A number's literal is kept: 1.0 and 1 are different images.
	if b := mustID(t, "", keylessEvent(pgSnapshotSource, "r", "null", `{"n":1.0}`, "1")); b == mustID(t, "", keylessEvent(pgSnapshotSource, "r", "null", `{"n":1}`, "1")) {
		t.Errorf("1.0 and 1: one ID %s", b)
	}
	keyed := func(after string) string {
		return mustID(t, `{"id":1}`, keylessEvent(pgSnapshotSource, "r", "null", after, "1"))
	}
	if a, b := keyed(auditRow(1)), keyed(auditRow(2)); a != b || strings.Contains(a, "image=") {
		t.Errorf("keyed row: IDs %s, %s depend on the image", a, b)
	}
}

// ParseDebezium reports a snapshot read (by op r, or by source.snapshot)
// and the row image's hash, which ignores the serialisation.
func TestParseDebeziumSnapshotAndImage(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		snapshot    bool
	}{
		{"postgres snapshot", keylessEvent(pgSnapshotSource, "r", "null", auditRow(1), "1"), true},
		{"incremental snapshot marker, op r", keylessEvent(strings.Replace(pgSnapshotSource, `"snapshot":"true"`, `"snapshot":"incremental"`, 1), "r", "null", auditRow(1), "1"), true},
		{"old boolean snapshot flag", keylessEvent(strings.Replace(mysqlSnapshotSource, `"snapshot":"true"`, `"snapshot":true`, 1), "c", "null", auditRow(1), "1"), true},
		{"streamed", keylessEvent(pgCopySource, "c", "null", auditRow(1), "1"), false},
	} {
		ch, err := ParseDebezium([]byte(tc.value))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if ch.Snapshot != tc.snapshot {
			t.Errorf("%s: Snapshot %v, want %v", tc.name, ch.Snapshot, tc.snapshot)
		}
		again, err := ParseDebezium([]byte(reorder(t, tc.value)))
		if err != nil || len(ch.Image) != 64 || again.Image != ch.Image {
			t.Errorf("%s: image %q, reordered %q (%v)", tc.name, ch.Image, again.Image, err)
		}
	}
}
