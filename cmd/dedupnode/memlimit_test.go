package main

import "testing"

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"": 0, "1073741824": 1 << 30, "768MiB": 768 << 20, "768M": 768 << 20, "1GiB": 1 << 30,
		"1.5 GiB": 3 << 29, "64kb": 64 << 10, "2G": 2 << 30,
	} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"lots", "1TB", "-1G", "G", "1..5G"} {
		if got, err := parseByteSize(in); err == nil {
			t.Errorf("parseByteSize(%q) = %d, want an error", in, got)
		}
	}
}
