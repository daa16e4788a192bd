package bloom

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
)

// File format written by Save (integers big-endian):
//
//	magic "DDNBLOM2" | expected per bucket (8) | fp rate (8, float64 bits)
//	| applied index (8) | chains (8)
//	chain*: namespace (4) | bucket (8) | segments (4)
//	        segment*: n (8) | limit (8) | k (4) | words (8) | word* (8)
//	SHA-256 of every preceding byte (32)
//
// A segment is a blocked filter (filter, blocked.go, documents which bits
// an ID sets): words < 16 is one short block, else words / 16 blocks of 16.
// "DDNBLOM1" files held bits-and-blooms filters (murmur3 locations over one
// bit array): Load refuses them (ErrBadFilterFile) and the owner rebuilds
// the filters from storage.
const persistMagic = "DDNBLOM2"

// ErrBadFilterFile is returned by Load for a file whose checksum, magic or
// parameters do not match; the caller discards it and rebuilds.
var ErrBadFilterFile = errors.New("bad bloom filter file")

// Save writes every chain and the applied index it covers to w.
func (f *Filters) Save(w io.Writer, appliedIndex uint64) error {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)
	f.mu.RLock()
	var hdr [40]byte
	copy(hdr[:8], persistMagic)
	binary.BigEndian.PutUint64(hdr[8:], uint64(f.cfg.ExpectedPerBucket))
	binary.BigEndian.PutUint64(hdr[16:], math.Float64bits(f.cfg.FPRate))
	binary.BigEndian.PutUint64(hdr[24:], appliedIndex)
	binary.BigEndian.PutUint64(hdr[32:], uint64(len(f.chains)))
	// bufio.Writer keeps the first write error and returns it from every
	// later Write and from Flush, so only Flush is checked.
	bw.Write(hdr[:])
	var word [8]byte
	for k, c := range f.chains {
		var ch [16]byte
		binary.BigEndian.PutUint32(ch[:], k.Namespace)
		binary.BigEndian.PutUint64(ch[4:], k.Bucket)
		binary.BigEndian.PutUint32(ch[12:], uint32(len(c.segs)))
		bw.Write(ch[:])
		for _, s := range c.segs {
			var sh [28]byte
			binary.BigEndian.PutUint64(sh[:], uint64(s.n))
			binary.BigEndian.PutUint64(sh[8:], uint64(s.limit))
			binary.BigEndian.PutUint32(sh[16:], uint32(s.f.k))
			binary.BigEndian.PutUint64(sh[20:], uint64(len(s.f.words)))
			bw.Write(sh[:])
			for _, w := range s.f.words {
				binary.BigEndian.PutUint64(word[:], w)
				bw.Write(word[:])
			}
		}
	}
	f.mu.RUnlock()
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("save bloom filters: %w", err)
	}
	if _, err := w.Write(h.Sum(nil)); err != nil {
		return fmt.Errorf("save bloom filters: %w", err)
	}
	return nil
}

// Load reads a file written by Save. It succeeds only if the checksum, the
// magic and the configuration (expected per bucket, FP rate) all match; then
// it replaces every chain, marks the filters ready and returns the applied
// index the file covers. The caller must check that index against the
// store's before trusting the filters. On error the filters are unchanged.
func (f *Filters) Load(r io.Reader) (appliedIndex uint64, err error) {
	data, err := readAllSized(r)
	if err != nil {
		return 0, fmt.Errorf("read bloom filters: %w", err)
	}
	if len(data) < 40+32 {
		return 0, fmt.Errorf("%w: %d bytes", ErrBadFilterFile, len(data))
	}
	body, sum := data[:len(data)-32], data[len(data)-32:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return 0, fmt.Errorf("%w: checksum mismatch", ErrBadFilterFile)
	}
	if string(body[:8]) != persistMagic {
		return 0, fmt.Errorf("%w: magic %q", ErrBadFilterFile, body[:8])
	}
	exp := binary.BigEndian.Uint64(body[8:])
	fp := math.Float64frombits(binary.BigEndian.Uint64(body[16:]))
	if exp != uint64(f.cfg.ExpectedPerBucket) || fp != f.cfg.FPRate {
		return 0, fmt.Errorf("%w: parameters %d/%g differ from configured %d/%g", ErrBadFilterFile, exp, fp, f.cfg.ExpectedPerBucket, f.cfg.FPRate)
	}
	appliedIndex = binary.BigEndian.Uint64(body[24:])
	nchains := binary.BigEndian.Uint64(body[32:])
	rd := bytes.NewReader(body[40:])
	chains := make(map[Key]*chain, min(nchains, 1<<16))
	for range nchains {
		var ch [16]byte
		if _, err := io.ReadFull(rd, ch[:]); err != nil {
			return 0, fmt.Errorf("%w: chain header: %v", ErrBadFilterFile, err)
		}
		k := Key{Namespace: binary.BigEndian.Uint32(ch[:]), Bucket: binary.BigEndian.Uint64(ch[4:])}
		nseg := binary.BigEndian.Uint32(ch[12:])
		if nseg > 64 {
			return 0, fmt.Errorf("%w: %d segments", ErrBadFilterFile, nseg)
		}
		c := &chain{}
		for range nseg {
			var sh [28]byte
			if _, err := io.ReadFull(rd, sh[:]); err != nil {
				return 0, fmt.Errorf("%w: segment header: %v", ErrBadFilterFile, err)
			}
			fk := binary.BigEndian.Uint32(sh[16:])
			nw := binary.BigEndian.Uint64(sh[20:])
			if fk < 1 || fk > maxK || nw == 0 || (nw > blockWords && nw%blockWords != 0) || nw > uint64(rd.Len())/8 {
				return 0, fmt.Errorf("%w: segment of %d words, k=%d", ErrBadFilterFile, nw, fk)
			}
			bf := newFilter(int(nw), int(fk))
			ws := body[len(body)-rd.Len():][:nw*8] // length checked above
			for i := range bf.words {
				bf.words[i] = binary.BigEndian.Uint64(ws[8*i:])
			}
			rd.Seek(int64(nw*8), io.SeekCurrent)
			c.segs = append(c.segs, segment{f: bf, n: uint(binary.BigEndian.Uint64(sh[:])), limit: uint(binary.BigEndian.Uint64(sh[8:]))})
		}
		chains[k] = c
	}
	if rd.Len() != 0 {
		return 0, fmt.Errorf("%w: %d trailing bytes", ErrBadFilterFile, rd.Len())
	}
	f.mu.Lock()
	f.chains = make(map[Key]*chain, len(chains))
	f.byNS = make(map[uint32][]bucketChain)
	f.logged = 0 // loaded chains keep no log: their IDs' hashes are not saved
	for k, c := range chains {
		f.chains[k] = c
		f.indexLocked(k, c)
	}
	f.recomputeMaxKLocked()
	f.ready = true
	f.mu.Unlock()
	return appliedIndex, nil
}

// readAllSized is io.ReadAll into one buffer sized up front when r can say
// how much it holds (an *os.File's Stat, a bytes.Reader's Len). A saved
// file of 10M IDs is ~65 MB: io.ReadAll's doubling growth spent ~0.5 s of a
// 0.7 s Load zeroing and copying buffers, on the restart's critical path.
func readAllSized(r io.Reader) ([]byte, error) {
	size := int64(-1)
	switch v := r.(type) {
	case interface{ Stat() (fs.FileInfo, error) }:
		if fi, err := v.Stat(); err == nil && fi.Mode().IsRegular() {
			size = fi.Size()
		}
	case interface{ Len() int }:
		size = int64(v.Len())
	}
	if size < 0 {
		return io.ReadAll(r)
	}
	// bytes.Buffer.ReadFrom keeps bytes.MinRead free before each read, so
	// that much extra keeps it from growing at the end.
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}
