// Package c10dstore serves torch's c10d TCPStore wire protocol from Go, so
// that hyperpodrun's agent can host the rendezvous store of its workers
// (torchrun's agent store: workers run with TORCHELASTIC_USE_AGENT_STORE=True
// and connect to MASTER_ADDR:MASTER_PORT with is_master=False), up before
// any worker starts.
//
// # Wire protocol
//
// A client sends queries: one query byte, then its arguments. Strings and
// byte vectors are a uint64 length and the bytes; integers are native
// (little-endian) int64/uint64, the PING nonce and the VALIDATE magic uint32.
// Replies are the same encodings; SET, APPEND, MULTI_SET, QUEUE_PUSH and
// VALIDATE have none.
//
// Two dialects exist and both are served, chosen per connection by its
// first bytes:
//
//   - DialectLegacy (torch 1.x through 2.1, the classic TCPStore daemon):
//     no handshake. SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5
//     GETNUMKEYS=6 WATCH_KEY=7 DELETE_KEY=8, and from torch 2.0 APPEND=9
//     MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12. torch 1.13 also opens a
//     second, idle "callback" connection per client, used only by WATCH_KEY.
//   - DialectV2 (torch 2.2 and later, the libuv store): the client's first
//     query is VALIDATE=0 with the magic 0x3C85F7CE, then PING=13 with a
//     nonce that must come back; every other query byte is the legacy one
//     plus one (SET=1 ... GETNUMKEYS=7), WATCH_KEY is gone (DELETE_KEY=8
//     APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12 keep their bytes),
//     and QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16 exist (torch 2.8's set).
//
// A connection whose first byte is 0 followed by the magic speaks V2; any
// other start is legacy. The two cannot be confused within the limits: a
// legacy SET whose key length began with the magic would announce a key of
// about 1 GB.
//
// # Semantics (those of torch's servers)
//
//   - WAIT replies STOP_WAITING (0) once every key exists (a queue key counts
//     when it holds a value); CHECK replies READY (0) or NOT_READY (1) at
//     once. CANCEL_WAIT drops a pending wait and replies WAIT_CANCELED (1);
//     a STOP_WAITING that crossed the cancel is sent before it, as torch 2.x
//     clients expect. torch 1.13 gives up a timed-out wait without
//     CANCEL_WAIT; a new WAIT on the connection replaces the stale one.
//   - GET and MULTI_GET of a missing key reply an empty value (clients WAIT
//     first; torch 1.13's daemon dropped the connection instead).
//   - COMPARE_SET creates a missing key only when the expected value is
//     empty, and replies the value stored, or expected itself for a missing
//     key and a non-empty expected value.
//   - ADD parses the stored value as std::stoll does; a value that is not a
//     number closes the connection, as the exception does in torch.
//   - QUEUE_POP replies the queue length before the pop and, when it was
//     not zero, the value; each QUEUE_PUSH wakes one waiting popper.
//   - WATCH_KEY (legacy) replies KEY_CALLBACK_REGISTERED (3), then sends
//     (type, key, old value, new value) on every change of the key.
//
// # Robustness
//
// Keys, values, keys per query, bytes per query, the whole store, pending
// replies and connections are bounded (Options, Limits). A malformed or
// over-limit query closes only its connection, with a logged error; memory
// grows with bytes that arrive, not with lengths announced.
package c10dstore
