package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v2"
)

// applyConfigFile sets each flag of fs that is not set yet (on the command
// line or, before this call, from the environment) from the YAML file
// path. Keys are the flags' long names ("node-id", "tls-cert", ...);
// allowed lists the flags a file may set. Lists (peers, join) may be YAML
// sequences or comma-separated strings. An unknown key, a duplicate key
// or a value the flag refuses is a usage error naming the key.
//
// Precedence, highest first: command line, environment (DEDUPNODE_*),
// config file, defaults.
func applyConfigFile(fs *pflag.FlagSet, path string, allowed []string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return usagef("--config: %v", err)
	}
	var doc yaml.MapSlice
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return usagef("--config %s: %v", path, oneLine(err.Error()))
	}
	ok := map[string]bool{}
	for _, n := range allowed {
		ok[n] = true
	}
	seen := map[string]bool{}
	for _, item := range doc {
		key, isStr := item.Key.(string)
		if !isStr {
			return usagef("--config %s: key %v is not a string", path, item.Key)
		}
		if seen[key] {
			return usagef("--config %s: key %q appears twice", path, key)
		}
		seen[key] = true
		f := fs.Lookup(key)
		if f == nil || !ok[key] {
			return usagef("--config %s: unknown key %q%s", path, key, suggestKey(key, allowed))
		}
		if f.Changed {
			continue // command line or environment wins
		}
		val, err := configValue(item.Value)
		if err != nil {
			return usagef("--config %s: key %q: %v", path, key, err)
		}
		if err := f.Value.Set(val); err != nil {
			return usagef("--config %s: key %q: %v", path, key, err)
		}
		f.Changed = true
	}
	return nil
}

// configValue turns a YAML scalar or sequence of scalars into flag text.
func configValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", fmt.Errorf("empty value")
	case []any:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			s, err := configValue(e)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	case yaml.MapSlice, map[any]any:
		return "", fmt.Errorf("a mapping is not a flag value")
	}
	return fmt.Sprint(v), nil
}

// suggestKey proposes the allowed key closest to a mistyped one.
func suggestKey(key string, allowed []string) string {
	norm := func(s string) string { return strings.NewReplacer("_", "-", ".", "-").Replace(strings.ToLower(s)) }
	for _, a := range allowed {
		if norm(key) == a {
			return fmt.Sprintf(" (did you mean %q?)", a)
		}
	}
	best, bestD := "", 3
	for _, a := range allowed {
		if d := editDistance(key, a); d < bestD {
			best, bestD = a, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	s := append([]string(nil), allowed...)
	sort.Strings(s)
	return "; known keys: " + strings.Join(s, ", ")
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
