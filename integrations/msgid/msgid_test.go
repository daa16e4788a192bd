package msgid

import (
	"errors"
	"testing"
)

func TestJSONField(t *testing.T) {
	body := []byte(`{"id":"evt-1","n":42,"data":{"event_id":"e-9","empty":"","list":[{"id":"x"}]},"flag":true,"nil":null}`)
	for _, tc := range []struct {
		path, want string
		noID       bool
	}{
		{path: "id", want: "evt-1"},
		{path: "n", want: "42"},
		{path: "data.event_id", want: "e-9"},
		{path: "data.list.0.id", want: "x"},
		{path: "data.list.1.id", noID: true},
		{path: "data.list.01.id", noID: true},
		{path: "missing", noID: true},
		{path: "data.empty", noID: true},
		{path: "flag", noID: true},
		{path: "nil", noID: true},
		{path: "data", noID: true},
		{path: "id.deeper", noID: true},
	} {
		got, err := JSONField(body, tc.path)
		if tc.noID {
			if !errors.Is(err, ErrNoID) {
				t.Errorf("%s: got %q, %v; want ErrNoID", tc.path, got, err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.path, got, err, tc.want)
		}
	}
	if _, err := JSONField([]byte("not json"), "id"); err == nil || errors.Is(err, ErrNoID) {
		t.Errorf("non-JSON body: %v, want a parse error", err)
	}
	if string(Content([]byte("x"))) != "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881" {
		t.Error("Content is not the hex SHA-256 of the body")
	}
}
