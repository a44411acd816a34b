"""The program that runs INSIDE the sandbox, before and around the model-written code.

It is passed to `python -I -S -c` as source text (stdlib only, no imports from evolve). argv:
    argv[1]  uid to drop to before anything else ("-" = stay; the process backend run by root uses it)
    argv[2]  result channel: "fd:N" (a pipe only the host reads) or "marker" (lines on stdout that
             start with the request's random marker; the docker backend, which has no spare fd)
It reads one JSON request from stdin, sets hard rlimits, runs the code and writes one JSON line per
result on the channel. Nothing but JSON crosses back; the host parses it with json.loads only.
Code that runs here can forge its own results (it shares this interpreter), never anyone else's.
"""

# ruff: noqa: BLE001, S102, S110  (this file exists to exec untrusted code and to survive whatever it does)
import builtins
import math
import os
import resource
import sys
import time

try:  # _signal and _json, not signal and json: those import enum and re, a third of a cold start
    import _signal as signal  # type: ignore[import-not-found]  # typeshed has no _signal; signal's API
except ImportError:  # pragma: no cover
    import signal
try:
    import _json
except ImportError:  # pragma: no cover
    _json = None  # type: ignore[assignment]  # the json module below

FILENAME = "<sandbox>"


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"non-standard JSON constant {name}")


def _loads(text):
    if _json is None:
        import json

        return json.loads(text)
    obj, end = _json.make_scanner(_ScanContext())(text, 0)  # type: ignore[arg-type]  # reads these attributes only
    if text[end:].strip():
        raise ValueError("extra data after the JSON request")
    return obj


def _dumps(value):
    """Strict JSON (ASCII, no NaN/Infinity, str keys like json.dumps makes them), without json/re."""
    if _json is None:
        import json

        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    esc = _json.encode_basestring_ascii
    out, seen = [], set()

    def key_of(k):
        if isinstance(k, str):
            return k
        if k is True:
            return "true"
        if k is False:
            return "false"
        if k is None:
            return "null"
        if isinstance(k, int):
            return int.__repr__(k)
        if isinstance(k, float):
            return num(k)
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")

    def num(f):
        if not math.isfinite(f):
            raise ValueError(f"Out of range float values are not JSON compliant: {f!r}")
        return float.__repr__(f)

    def enc(o):
        if isinstance(o, str):
            out.append(esc(o))
        elif o is None:
            out.append("null")
        elif o is True:
            out.append("true")
        elif o is False:
            out.append("false")
        elif isinstance(o, int):
            out.append(int.__repr__(o))
        elif isinstance(o, float):
            out.append(num(o))
        elif isinstance(o, (list, tuple, dict)):
            if id(o) in seen:
                raise ValueError("Circular reference detected")
            seen.add(id(o))
            if isinstance(o, dict):
                out.append("{")
                for n, (k, v) in enumerate(o.items()):
                    out.append("," if n else "")
                    out.append(esc(key_of(k)) + ":")
                    enc(v)
                out.append("}")
            else:
                out.append("[")
                for n, v in enumerate(o):
                    if n:
                        out.append(",")
                    enc(v)
                out.append("]")
            seen.discard(id(o))
        else:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    enc(value)
    return "".join(out)


class SandboxTimeout(BaseException):
    """Raised by SIGALRM when a run or one call of a batch exceeds its wall-clock limit."""


def _alarm(signum, frame):
    raise SandboxTimeout()


class Channel:
    def __init__(self, spec, marker):
        self.marker = None
        if spec.startswith("fd:"):
            self.fd = int(spec[3:])
            os.set_inheritable(self.fd, False)
        else:
            self.fd = os.dup(1)
            os.set_inheritable(self.fd, False)
            self.marker = marker.encode("ascii")

    def emit(self, line):
        data = line.encode("utf-8") + b"\n"
        if self.marker is not None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            data = b"\n" + self.marker + data
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def set_limits(lim):
    def cap(res, soft, hard):
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))

    mb = 1024 * 1024
    cap(resource.RLIMIT_CORE, 0, 0)
    cap(resource.RLIMIT_CPU, int(lim["cpu_s"]), int(lim["cpu_s"]) + 1)  # SIGXCPU, then SIGKILL a second later
    cap(resource.RLIMIT_FSIZE, int(lim["file_size_mb"]) * mb, int(lim["file_size_mb"]) * mb)
    cap(resource.RLIMIT_NOFILE, 256, 256)
    cap(resource.RLIMIT_AS, int(lim["memory_mb"]) * mb, int(lim["memory_mb"]) * mb)
    if lim.get("nproc"):
        cap(resource.RLIMIT_NPROC, int(lim["nproc"]), int(lim["nproc"]))


def new_globals(name, extra):
    g = {"__name__": name, "__builtins__": builtins, "__file__": FILENAME}
    g.update(extra)
    return g


def load(code, g):
    global _CODE
    _CODE = code
    exec(compile(code, FILENAME, "exec", dont_inherit=True), g)
    return g


def encode(value, cap):
    try:
        text = _dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultError(
            f"the result is not JSON-serialisable ({type(exc).__name__}: {exc}); return only "
            "dict, list, str, int, float (finite), bool or None"
        ) from None
    if len(text) > cap:
        raise ResultError(f"the result is {len(text)} bytes of JSON, over the cap of {cap} (Limits.output_bytes)")
    return text


class ResultError(Exception):
    pass


def outcome(fn, wall_s, cap, exit_ok=False):
    """Run fn under a wall-clock alarm; return the JSON fields of one result (value pre-encoded)."""
    try:
        signal.setitimer(signal.ITIMER_REAL, wall_s)
        try:
            text = encode(fn(), cap)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return {"verdict": "ok"}, text
    except SandboxTimeout:
        return {"verdict": "timeout", "error": f"wall-clock limit of {wall_s:g}s exceeded"}, "null"
    except MemoryError:
        return {"verdict": "memory", "error": _format_exc("MemoryError (Limits.memory_mb reached)")}, "null"
    except ResultError as exc:
        return {"verdict": "error", "error": str(exc)}, "null"
    except SystemExit as exc:
        if exit_ok is not False and exc.code in (0, None):
            try:
                return {"verdict": "ok"}, encode(exit_ok(), cap)
            except ResultError as rexc:
                return {"verdict": "error", "error": str(rexc)}, "null"
        return {"verdict": "error", "error": f"the code called sys.exit({exc.code!r})"}, "null"
    except BaseException:
        return {"verdict": "error", "error": _format_exc("error")}, "null"


_CODE = ""


def _format_exc(fallback):
    """The traceback of the exception being handled, without the bootstrap's own frames."""
    try:
        import linecache
        import traceback

        linecache.cache[FILENAME] = (len(_CODE), None, _CODE.splitlines(True), FILENAME)
        exc = sys.exc_info()[1]
        assert exc is not None  # called while one is handled
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != "<string>"])
        return "".join(te.format())
    except BaseException:
        return fallback


class Capture:
    """Per-call stdout/stderr for batches: fds 1 and 2 point at unlinked files in /tmp during a call."""

    def __init__(self, cap):
        self.cap = cap
        self.saved = (os.dup(1), os.dup(2))
        self.files = []
        for stream in ("out", "err"):
            path = f"/tmp/.sandbox-{stream}-{os.getpid()}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.unlink(path)
            self.files.append(fd)

    def start(self):
        _flush()
        for target, fd in zip((1, 2), self.files):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.dup2(fd, target)

    def stop(self):
        _flush()
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        texts, truncated = [], False
        for fd in self.files:
            os.lseek(fd, 0, os.SEEK_SET)
            chunks, size = [], 0
            while size <= self.cap:
                chunk = os.read(fd, min(65536, self.cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
            if len(data) > self.cap:
                data, truncated = data[: self.cap], True
            texts.append(data.decode("utf-8", "replace"))
        return texts[0], texts[1], truncated


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def line(index, fields, value_text, extra=None, cap=1000000):
    body = dict(fields)
    if isinstance(body.get("error"), str) and len(body["error"]) > cap:
        body["error"] = body["error"][:cap] + "\n[... error text truncated]"
    body["i"] = index
    if extra:
        body.update(extra)
    head = _dumps(body)
    return head[:-1] + ',"value":' + value_text + "}"


def main():
    if sys.argv[1] != "-":
        uid = int(sys.argv[1])
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    request = _loads(sys.stdin.buffer.read().decode("utf-8"))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    channel = Channel(sys.argv[2], request.get("marker") or "")
    lim = request["limits"]
    wall, cap = float(lim["wall_s"]), int(lim["output_bytes"])
    signal.signal(signal.SIGALRM, _alarm)
    set_limits(lim)
    mode, code = request["mode"], request["code"]
    try:
        if mode == "run":
            g = new_globals("__main__", {"INPUTS": request.get("inputs") or {}})

            def run():
                load(code, g)
                return g.get("RESULT")

            # sys.exit(0) ends a script normally: RESULT is whatever it had set by then.
            fields, text = outcome(run, wall, cap, exit_ok=lambda: g.get("RESULT"))
            channel.emit(line(0, fields, text, cap=cap))
        elif mode == "call":

            def call():
                g = load(code, new_globals("__sandbox__", {}))
                return _function(g, request["function"])(**(request.get("kwargs") or {}))

            fields, text = outcome(call, wall, cap)
            channel.emit(line(0, fields, text, cap=cap))
        else:
            run_many(channel, code, request["function"], request["calls"], wall, cap)
        channel.emit('{"done": true}')
    finally:
        _flush()
    os._exit(0)


def _function(g, name):
    fn = g.get(name)
    if not callable(fn):
        raise NameError(f"the code defines no function named {name!r}")  # noqa: TRY004 - it is a lookup
    return fn


def run_many(channel, code, function, calls, wall, cap):
    capture = Capture(cap)
    module = new_globals("__sandbox__", {})

    def load_module():
        load(code, module)
        _function(module, function)

    capture.start()
    fields, _ = outcome(lambda: load_module(), wall, cap)
    out, err, cut = capture.stop()
    if fields["verdict"] != "ok":
        fields["error"] = "loading the code failed: " + fields.get("error", "")
        channel.emit(line(-1, fields, "null", {"stdout": out, "stderr": err, "truncated": cut}, cap))
        return
    fn = module[function]
    for index, kwargs in enumerate(calls):
        channel.emit(f'{{"i": {index}, "start": true}}')
        capture.start()
        began = time.perf_counter()
        fields, text = outcome(lambda kw=kwargs: fn(**(kw or {})), wall, cap)
        took = time.perf_counter() - began
        out, err, cut = capture.stop()
        channel.emit(line(index, fields, text, {"stdout": out, "stderr": err, "truncated": cut, "t": took}, cap))


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # the bootstrap itself failed: say so on stderr, exit non-zero
        try:
            import traceback

            sys.stderr.write(f"sandbox bootstrap failed: {exc}\n{traceback.format_exc()}")
            sys.stderr.flush()
        finally:
            os._exit(70)
