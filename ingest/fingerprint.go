package ingest

import (
	"crypto/sha256"

	"github.com/overage-billing/overage/internal/fastjson"
)

// fingerprint is SHA-256 over the method, the path and the RFC 8785
// canonical form of the body, so key order and whitespace never make two
// equal requests look different.
func fingerprint(method, path string, body []byte) ([]byte, error) {
	canon, err := fastjson.Canonical(body)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canon)
	return h.Sum(nil), nil
}
