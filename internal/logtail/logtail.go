// Package logtail reads the end of a process's log file, for the error
// messages and test output that explain why a process the tests started
// (a node, a broker, a database) failed.
package logtail

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// Read returns about the last maxBytes bytes of the file at path, starting
// at a line boundary when the cut falls inside a line. A file that cannot
// be read yields a one-line note saying why, since the caller is already
// reporting a failure and wants what there is.
func Read(path string, maxBytes int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(log %s unreadable: %v)", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(log %s unreadable: %v)", path, err)
	}
	from := max(info.Size()-int64(maxBytes), 0)
	b, err := io.ReadAll(io.NewSectionReader(f, from, info.Size()-from))
	if err != nil {
		return fmt.Sprintf("(log %s unreadable: %v)", path, err)
	}
	if from > 0 {
		// Drop the partial first line, unless the cut is the only line.
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	return string(b)
}
