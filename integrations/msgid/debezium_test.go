package msgid

import (
	"errors"
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
		{"sqlserver", pgEvent(strings.Replace(pgSource, `"connector":"postgresql"`, `"connector":"sqlserver"`, 1), "1"), `"sqlserver"`, ErrUnsupportedConnector},
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
