//go:build !unix

package portlock

import "os"

// tryLock without flock: the port's file is opened and nothing is locked,
// so only the bind check guards against our other processes.
func tryLock(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o666)
	if err != nil {
		return nil, false, err
	}
	return f, true, nil
}
