"""The fleet's working set: which kernels a compiler/target/GPU group is using, fetched in one round trip.

The fleet store keeps, per namespace and group, a sorted set of value names scored by last use
(``<namespace>:ws:<layout>/<group>``), trimmed to :data:`MAX_MEMBERS`.  A hit or an upload adds its
name in the same pipeline as the request itself (no round trip of its own).  A process's first
lookup in a group asks for the group's newest names and their values in the same pipeline as that
lookup, at most :data:`FETCH_COUNT` of them and :data:`FETCH_BYTES` in all.

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

# The group's newest names and their values (each read up to ARGV[4] bytes), up to ARGV[2] names and
# ARGV[3] bytes.  One server only: a cluster keeps values on other slots than the set (fetched per key).
FETCH_SCRIPT = (
    "local names = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1) "
    "local out, used = {}, 0 "
    "for _, n in ipairs(names) do "
    "  local v = redis.call('GETRANGE', ARGV[1] .. n, 0, tonumber(ARGV[4])) "
    "  if #v > 0 and used + #v <= tonumber(ARGV[3]) then "
    "    used = used + #v; out[#out + 1] = n; out[#out + 1] = v "
    "  end "
    "end "
    "return out")


def group_of(name):
    """The group of an entry or JIT cubin name (its producer/target, and GPU for JIT), else ``None``."""
    if not name.endswith(_VALUE_SUFFIXES) or name.count("/") < 3:
        return None
    return name.rsplit("/", 2)[0]


def valid_name(member):
    """Whether a name read from a set (bytes) is one the layout could have written."""
    return (isinstance(member, bytes) and len(member) <= _MAX_NAME
            and _NAME.match(member.decode("ascii", "replace")) is not None)


def touch(set_key, name, now_ms):
    """The commands that record ``name``'s use (pipelined with the request that used it)."""
    return [("ZADD", set_key, now_ms, name), ("ZREMRANGEBYRANK", set_key, 0, -(MAX_MEMBERS + 1))]


def pairs(reply):
    """``[(name, raw value)]`` from a fetch's reply, within the bounds whatever the server sent
    (nothing from a reply of the wrong shape: the set is advisory)."""
    if not isinstance(reply, list) or len(reply) % 2:
        return []
    found, used = [], 0
    for index in range(0, len(reply), 2):
        name, raw = reply[index], reply[index + 1]
        if not isinstance(raw, bytes) or not valid_name(name):
            continue
        used += len(raw)
        if used > FETCH_BYTES or len(found) >= FETCH_COUNT:
            break
        found.append((name.decode("ascii"), raw))
    return found
