"""fields.py -- the request field readers of kvsieve-hf's server (the C
server's srv_get_*): a number in a range, a boolean, a string, or a
RequestError naming the field.

What it is not: no knowledge of endpoints (server.py, scoring.py).
"""
import math

from .engine import RequestError


def _num(obj, name, default, lo, hi, integer=False, field=None):
    v = obj.get(name)
    name = field or name
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise RequestError(400, name, "%s must be a number" % name)
    if integer and v != int(v):
        raise RequestError(400, name, "%s must be an integer" % name)
    if not lo <= v <= hi:
        raise RequestError(400, name, "%s must be in [%s, %s], got %s" % (name, lo, hi, v))
    return int(v) if integer else float(v)


def _bool(obj, name, default, field=None):
    v = obj.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(400, field or name, "%s must be true or false" % (field or name))
    return v


def _str(obj, name, default, field=None):
    v = obj.get(name)
    if v is None:
        return default
    if not isinstance(v, str):
        raise RequestError(400, field or name, "%s must be a string" % (field or name))
    return v
