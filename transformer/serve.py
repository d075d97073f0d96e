"""A translation server over HTTP: ``python -m transformer.serve CKPT [CKPT ...]`` (the
``transformer-serve`` command), JSON in and out, on the standard library's threading HTTP server.

``POST /translate`` with ``{"text": ["A dog runs.", ...]}`` (or one string) answers
``{"translations": [[{"text": "Ein Hund rennt.", "score": -0.14}], ...]}``: each line's
``nbest`` translations, best first, as :meth:`Translator.translate` gives them, in the request's
order. Optional fields: ``options`` (decode options, evaluate.py's ``decode.*``, over the server's
``--decode``), ``prefixes`` (each translation's start, one a line, "" for none) and
``constraints`` (the phrases each line's translations must hold, a list a line). ``GET /health``
answers the checkpoints, device and default options. A request the server cannot translate gets
status 400 and ``{"error": ...}`` naming the field; "line N" in an error is the request's Nth.
With ``--api-key`` (or ``$TRANSFORMER_SERVE_API_KEY``) ``POST /translate`` needs
``Authorization: Bearer KEY`` (401 without it). Ctrl-C or SIGTERM stops listening, answers the
requests already read, and exits with status 0.

One model in memory, decoded by one thread (the search's caches are the model's). Requests that
arrive while it decodes wait, and those with the same options (and constraints or none alike) are
then decoded together, up to ``--batch-lines`` lines (:mod:`transformer.request_batches`): their
lines are batched by length as evaluate.py's ``input=`` batches them, and each request gets the
answer it would get alone. Sampling requests are decoded alone (a line's draws depend on its
index).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from transformer.checkpoints import checkpoint_paths
from transformer.decoding import DecodeOptions
from transformer.device import dtype_name
from transformer.errors import DataError, UserError
from transformer.request_batches import Batcher, Job
from transformer.translate import Translation, Translator

log = logging.getLogger(__name__)
FIELDS = ("text", "options", "prefixes", "constraints")
MAX_BODY = 16 * 2**20  # bytes a request may send
KEEP_ALIVE = 5.0  # seconds a connection may wait for its next request (or a body's next bytes)
API_KEY_ENV = "TRANSFORMER_SERVE_API_KEY"  # the key, kept out of the command line


def _strings(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise DataError(f"{field} must be a list of strings, got {json.dumps(value)[:80]}")
    return value


def parse_request(
    body: bytes, defaults: dict[str, Any]
) -> tuple[list[str], DecodeOptions, list[str] | None, list[list[str]] | None]:
    """A ``/translate`` body's lines, decode options (``defaults`` under its ``options``),
    prefixes and constraints, their types checked: a :class:`DataError` or ``ConfigError`` names
    the field (one prefix and one list of constraints a line: :class:`Job` checks)."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        example = '{"text": ["a line", ...]}'
        raise DataError(f"the body is not JSON ({err}): send {example}") from None
    if not isinstance(request, dict) or "text" not in request:
        raise DataError('the body must be a JSON object with "text": {"text": ["a line", ...]}')
    if unknown := sorted(set(request) - set(FIELDS)):
        raise DataError(f"unknown field {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    text = request["text"]
    lines = [text] if isinstance(text, str) else _strings(text, "text")
    for i, line in enumerate(lines):
        if "\n" in line or "\r" in line:
            raise DataError(f"text[{i}] holds a line break: send each line as an item of its own")
    options = request.get("options", {})
    if not isinstance(options, dict):
        raise DataError(f'options must be an object, e.g. {{"beam_size": 4}}, got {options!r}')
    decode = DecodeOptions.from_dict({**defaults, **options}, prefix="options")
    prefixes = request.get("prefixes")
    if prefixes is not None:
        prefixes = _strings(prefixes, "prefixes")
    constraints = request.get("constraints")
    if constraints is not None:
        if not isinstance(constraints, list):
            raise DataError("constraints must be a list of lists of phrases, one list a line")
        constraints = [_strings(c, f"constraints[{i}]") for i, c in enumerate(constraints)]
    return lines, decode, prefixes, constraints


def as_json(translation: Translation, options: DecodeOptions, constrained: bool) -> dict[str, Any]:
    """One translation's fields: text and score, its alignment where ``options.alignment`` asks,
    whether it holds its constraints where the request gave some."""
    out: dict[str, Any] = {"text": translation.text, "score": translation.score}
    if options.alignment:
        out["alignment"] = translation.alignment
    if constrained:
        out["constraints_met"] = translation.constraints_met
    return out


class TranslationServer(ThreadingHTTPServer):
    """Serves one :class:`Translator` at ``address`` ((host, port); port 0: any free one).
    :meth:`server_close` stops listening and returns once every request it has read is answered
    (a connection idle for :data:`KEEP_ALIVE` seconds is closed)."""

    daemon_threads = False  # server_close waits for the requests being answered

    def __init__(
        self,
        address: tuple[str, int],
        translator: Translator,
        defaults: dict[str, Any] | None = None,
        checkpoints: Sequence[str] = (),
        max_tokens: int = 4096,
        batch_lines: int = 64,
        api_key: str | None = None,
    ) -> None:
        """With ``api_key``, ``POST /translate`` needs ``Authorization: Bearer <api_key>``
        (``GET /health`` does not: a load balancer's probe)."""
        self.api_key = api_key
        self.defaults = dict(defaults or {})
        DecodeOptions.from_dict(self.defaults, prefix="--decode")  # checked before listening
        self.health = {
            "status": "ok",
            "checkpoints": list(checkpoints),
            "models": len(translator.models),
            "device": str(translator.device),
            "dtype": dtype_name(next(translator.model.parameters()).dtype),
            "options": self.defaults,
            "max_tokens": max_tokens,
            "batch_lines": batch_lines,
        }
        self.batcher = Batcher(translator, max_tokens, batch_lines)
        super().__init__(address, _Handler)  # a port in use: server_close, then the OSError

    def translate(self, body: bytes) -> dict[str, Any]:
        """The answer to a ``/translate`` body; a :class:`UserError` for a bad request."""
        job = Job(*parse_request(body, self.defaults))
        found = self.batcher.translate(job)
        constrained = job.constraints is not None
        return {"translations": [[as_json(t, job.options, constrained) for t in s] for s in found]}

    def server_close(self) -> None:
        super().server_close()
        self.batcher.close()


class _Handler(BaseHTTPRequestHandler):
    server: TranslationServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's requests share one connection
    timeout = KEEP_ALIVE

    def do_GET(self) -> None:
        if self.path != "/health":
            return self._answer(HTTPStatus.NOT_FOUND, {"error": f"no GET {self.path}: /health"})
        self._answer(HTTPStatus.OK, self.server.health)

    def do_POST(self) -> None:
        size = self.headers.get("Content-Length", "")
        refused = None  # (status, message) of a request whose body is not read
        if self.path != "/translate":
            refused = HTTPStatus.NOT_FOUND, f"no POST {self.path}: /translate"
        elif not self._authorized():
            refused = HTTPStatus.UNAUTHORIZED, "send the server's key: Authorization: Bearer KEY"
        elif not size.isdigit():
            refused = HTTPStatus.LENGTH_REQUIRED, "send a Content-Length"
        elif int(size) > MAX_BODY:
            refused = (
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                (f"the body has {size} bytes, more than {MAX_BODY}: send fewer lines a request"),
            )
        if refused is not None:
            self.close_connection = True  # an unread body would be read as the next request
            return self._answer(refused[0], {"error": refused[1]})
        body = self.rfile.read(int(size))
        try:
            answer = self.server.translate(body)
        except UserError as err:
            return self._answer(HTTPStatus.BAD_REQUEST, {"error": str(err)})
        except Exception:
            log.exception("POST /translate failed")  # the traceback in the server's log
            return self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal error"})
        self._answer(HTTPStatus.OK, answer)

    def _authorized(self) -> bool:
        key = self.server.api_key
        given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return key is None or hmac.compare_digest(given.encode(), key.encode())

    def _answer(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.serve",
        description='Translate over HTTP: POST /translate {"text": [lines]}, GET /health.',
    )
    parser.add_argument("checkpoints", nargs="+", help="checkpoints written by train.py or "
                        "imported (or a quoted glob): several are averaged")  # fmt: skip
    parser.add_argument("--ensemble", action="store_true", help="decode several checkpoints "
                        "together instead of averaging them")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default "
                        "127.0.0.1: this machine only; 0.0.0.0: every interface)")  # fmt: skip
    parser.add_argument("--port", type=int, default=8080, help="default 8080; 0: any free one")
    parser.add_argument("--device", default="auto", help="auto (a GPU where there is one), cpu "
                        "or cuda")  # fmt: skip
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--direction", help="a multilingual model's direction, e.g. en-fr "
                        "(default: its first)")  # fmt: skip
    parser.add_argument("--decode", default="{}", help="the server's decode options as JSON, "
                        "e.g. '{\"beam_size\": 4}' (default: evaluate.py's, beam 5); a "
                        "request's \"options\" override them")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=4096, help="source tokens a batch "
                        "holds, padding included (default 4096)")  # fmt: skip
    parser.add_argument("--batch-lines", type=int, default=64, help="lines of waiting requests "
                        "decoded together (default 64; 1: each request alone)")  # fmt: skip
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help="POST /translate needs 'Authorization: Bearer KEY' (default: "
                        f"${API_KEY_ENV}, which keeps it out of the process list; unset: "
                        "none needed)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        defaults = json.loads(args.decode)
        if not isinstance(defaults, dict):
            raise ValueError("not an object")
    except ValueError as err:
        parser.exit(2, f"error: --decode={args.decode!r} is not a JSON object ({err})\n")
    for option, value in (("--max-tokens", args.max_tokens), ("--batch-lines", args.batch_lines)):
        if value < 1:
            parser.exit(2, f"error: {option} must be >= 1, got {value}\n")
    try:
        paths = checkpoint_paths(args.checkpoints, option="checkpoints")
        DecodeOptions.from_dict(defaults, prefix="--decode")
        translator = Translator.from_checkpoint(
            *paths, ensemble=args.ensemble, device=args.device, dtype=args.dtype,
            direction=args.direction,
        )  # fmt: skip
    except UserError as err:
        parser.exit(2, f"error: {err}\n")
    try:
        server = TranslationServer(
            (args.host, args.port), translator, defaults, paths, args.max_tokens,
            args.batch_lines, args.api_key or None,
        )  # fmt: skip
    except OSError as err:
        parser.exit(2, f"error: cannot listen on {args.host}:{args.port} ({err.strerror}): "
                    "choose another --port (or --host)\n")  # fmt: skip
    host, port = server.server_address[:2]
    log.info("serving %s on http://%s:%d: POST /translate%s, GET /health", paths[0], host, port,
             " (with the API key)" if args.api_key else "")  # fmt: skip
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop: as Ctrl-C
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopping: answering the requests already read")
    finally:
        server.server_close()
    log.info("stopped")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
