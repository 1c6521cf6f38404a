"""Comm ids every member derives alike from a parent's, without exchanging one (the children of
Comm.shrink and Comm.grow). The same function as the C++ client's (client/cpp/derived_comm_id.cc),
so that ranks in either language derive the same id."""

_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _fnv(data: bytes, h: int) -> int:
    for c in data:
        h ^= c
        h = (h * 0x100000001B3) & _MASK
    return _mix(h)


def derived_comm_id(parent: str, salt: str, coordinator: str = "") -> str:
    """``ry1-<32 hex>@<coordinator>`` from (parent, salt); the parent's coordinator unless one is
    given (a shrink after the parent's coordinator node was lost)."""
    if not coordinator:
        coordinator = parent.split("@", 1)[1] if "@" in parent else ""
    what = f"{parent}/{salt}".encode()
    return (f"ry1-{_fnv(what, 0xCBF29CE484222325):016x}{_fnv(what, 0x84222325CBF29CE4):016x}"
            f"@{coordinator}")
