// Package msgid extracts message IDs from message bodies for the
// dedupnode integrations (NATS, Kafka, RabbitMQ, Watermill, webhooks): a
// field of a JSON body, the body's content hash when the producer set no
// ID, or, for change data capture, the source position of a Debezium
// change event (DebeziumID).
package msgid

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dedupnode/dedupnode/client"
)

// ErrNoID means a message carries no usable ID.
var ErrNoID = errors.New("message has no ID")

// JSONField returns the value at path in the JSON object body: path names
// nested object keys separated by dots ("id", "data.event_id"); an array
// element is named by its index ("events.0.id"). A string value is
// returned as its bytes, a number as its literal text ("42"). A missing
// field, null, an empty string, an object or a boolean is ErrNoID (wrapped,
// naming the path); a body that is not JSON is an error too.
func JSONField(body []byte, path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("empty JSON field path")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("body is not JSON: %w", err)
	}
	for _, key := range strings.Split(path, ".") {
		switch node := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = node[key]; !ok {
				return nil, fmt.Errorf("%w: no field %q", ErrNoID, path)
			}
		case []any:
			var i int
			if _, err := fmt.Sscanf(key, "%d", &i); err != nil || i < 0 || i >= len(node) || fmt.Sprint(i) != key {
				return nil, fmt.Errorf("%w: no element %q in %q", ErrNoID, key, path)
			}
			v = node[i]
		default:
			return nil, fmt.Errorf("%w: no field %q", ErrNoID, path)
		}
	}
	switch val := v.(type) {
	case string:
		if val == "" {
			return nil, fmt.Errorf("%w: field %q is empty", ErrNoID, path)
		}
		return []byte(val), nil
	case json.Number:
		return []byte(val.String()), nil
	}
	return nil, fmt.Errorf("%w: field %q is %T, want a string or a number", ErrNoID, path, v)
}

// Content returns the content-derived ID of body: client.ContentID, the
// lower-case hex SHA-256 (so identical bodies are duplicates).
func Content(body []byte) []byte { return client.ContentID(body) }
