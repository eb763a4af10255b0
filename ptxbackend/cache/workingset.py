"""The fleet's working set: which kernels a compiler/target/GPU group is using, fetched in one round trip.

The fleet store keeps, per namespace and group, a sorted set of value names scored by last use
(``<namespace>:ws:<layout>/<group>``), trimmed to :data:`MAX_MEMBERS`.  A hit or an upload adds its
name in the same pipeline as the request itself (no round trip of its own).  A process's first
lookup in a group asks for the group's newest names and their values in the same pipeline as that
lookup, at most :data:`FETCH_COUNT` of them and :data:`FETCH_BYTES` in all, through a server
function (:data:`LIBRARY`) called read-only; a server without it answers the names, and their values
come in a second round trip.

The set is advisory: a name in it only makes a client fetch the value stored under that name, which
is then verified exactly as a single fetch is (the HMAC over its key, then the entry checks by the
caller).  A forged set costs bytes within the bounds, never a wrong kernel.
"""

import re

#: Names a group's set keeps (the newest by last use); older ones are trimmed at each touch.
MAX_MEMBERS = 4096
#: The most values, and bytes, one working-set fetch takes.
FETCH_COUNT = 2048
FETCH_BYTES = 64 << 20
_MAX_NAME = 400
# Names of the layout (layout.py): producer/target/kk/key.kind, .../jit/sm_cc-driver/kk/key.cubin,
# depsets/kk/digest.json.  Each part starts with a letter or digit: no "..", no empty part.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*){2,5}$")
_VALUE_SUFFIXES = (".ptx", ".cubin", ".fatbin")

#: The server-side half, a Valkey/Redis (>= 7) function library the rw build box loads (FUNCTION LOAD)
#: and every machine calls: line PCs only ``fetch``, with FCALL_RO (flagged ``no-writes``, so the server
#: itself refuses any write inside it), which needs no script rights (no EVAL) in their ACL.  The
#: version is in the names: a library of another ptxbackend version never answers for this one.
LIBRARY_NAME = "ptxbackend_1"
FETCH_FUNCTION = "ptxbackend_1_fetch"
TOUCH_FUNCTION = "ptxbackend_1_touch"
# fetch: the group's newest names and their values (each read up to args[4] bytes), up to args[2]
# names and args[3] bytes.  One server only: a cluster keeps values on other slots than the set.
# touch: one group's uses (args[3..], all at time args[1]) and the trim to args[2] names: one command
# per group, however many kernels it records.
LIBRARY = """#!lua name=ptxbackend_1
local function fetch(keys, args)
  local names = redis.call('ZREVRANGE', keys[1], 0, tonumber(args[2]) - 1)
  local out, used = {}, 0
  for _, n in ipairs(names) do
    local v = redis.call('GETRANGE', args[1] .. n, 0, tonumber(args[4]))
    if #v > 0 and used + #v <= tonumber(args[3]) then
      used = used + #v; out[#out + 1] = n; out[#out + 1] = v
    end
  end
  return out
end
local function touch(keys, args)
  for first = 3, #args, 256 do
    local members = {}
    for i = first, math.min(first + 255, #args) do
      members[#members + 1] = args[1]; members[#members + 1] = args[i]
    end
    redis.call('ZADD', keys[1], unpack(members))
  end
  redis.call('ZREMRANGEBYRANK', keys[1], 0, -(tonumber(args[2]) + 1))
  return #args - 2
end
redis.register_function{function_name='ptxbackend_1_fetch', callback=fetch, flags={'no-writes'}}
redis.register_function('ptxbackend_1_touch', touch)
"""


def group_of(name):
    """The group of an entry or JIT cubin name (its producer/target, and GPU for JIT), else ``None``."""
    if not name.endswith(_VALUE_SUFFIXES) or name.count("/") < 3:
        return None
    return name.rsplit("/", 2)[0]


def valid_name(member):
    """Whether a name read from a set (bytes) is one the layout could have written."""
    return (isinstance(member, bytes) and len(member) <= _MAX_NAME
            and _NAME.match(member.decode("ascii", "replace")) is not None)


def touch(set_key, names, now_ms, functions):
    """The commands that record ``names``' use in one group (pipelined with the request that used
    them): one FCALL where the server has the library, else ZADD of them all and the trim."""
    names = list(dict.fromkeys(names))  # once each, in order: a kernel used twice is one member
    if functions:
        return [("FCALL", TOUCH_FUNCTION, 1, set_key, now_ms, MAX_MEMBERS) + tuple(names)]
    members = []
    for name in names:
        members += [now_ms, name]
    return [("ZADD", set_key) + tuple(members), ("ZREMRANGEBYRANK", set_key, 0, -(MAX_MEMBERS + 1))]


def pairs(reply):
    """``[(name, raw value)]`` from a fetch's reply, within the bounds whatever the server sent
    (nothing from a reply of the wrong shape: the set is advisory)."""
    if not isinstance(reply, list) or len(reply) % 2:
        return []
    found, used = [], 0
    for index in range(0, len(reply), 2):
        name, raw = reply[index], reply[index + 1]
        if not isinstance(raw, (bytes, bytearray)) or not valid_name(name):
            continue
        used += len(raw)
        if used > FETCH_BYTES or len(found) >= FETCH_COUNT:
            break
        found.append((name.decode("ascii"), raw))
    return found
