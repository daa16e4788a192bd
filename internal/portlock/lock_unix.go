//go:build unix

package portlock

import (
	"errors"
	"os"
	"syscall"
)

// tryLock opens path and takes an exclusive flock on it without waiting.
// The kernel drops the lock when the file is closed or the process dies,
// so a killed test leaves no stale reservation behind.
//
// A lock file of another user that cannot be opened (its mode, or
// fs.protected_regular in the sticky directory) counts as taken.
func tryLock(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o666)
	if errors.Is(err, os.ErrPermission) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return f, true, nil
}
