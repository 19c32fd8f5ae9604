"""circuitlab serve: the local web explorer (FastAPI on uvicorn)."""
from __future__ import annotations

import argparse

HELP = ("local web explorer: attention of every head, logit lens, attribution, input attribution, tuned lens, "
        "steering, attribution graphs (/graphs), and the hand-built adder")
EXAMPLE = "circuitlab serve --checkpoint runs/demo/2l --port 8000   (then open http://127.0.0.1:8000)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from circuitlab.commands._args import add_option_parts
    from circuitlab.serve.app import ServeOptions

    def device(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default=ServeOptions.device,
                       help=f"torch device for the model (default {ServeOptions.device})")

    # every other flag declared once beside create_app (serve/app.py), in --help's order
    add_option_parts(p, ServeOptions, ("checkpoint", "dictionaries", "lens", "circuits",
                                       "graphs", "transcoders", "transcoder_set", "host", "port", "max_tokens", "max_prompt_chars"), device)


def check_port_free(host: str, port: int) -> None:
    """A CircuitlabError when host:port cannot be bound (in use, or not an address of this machine)."""
    import socket

    from circuitlab.errors import CircuitlabError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CircuitlabError(f"cannot resolve --host {host!r}: {e}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            raise CircuitlabError(f"cannot listen on {host}:{port} ({e.strerror or e}); "
                                  "choose another --port") from None


def run(args: argparse.Namespace) -> int:
    import sys
    from dataclasses import replace

    from circuitlab.serve import create_app
    from circuitlab.serve.app import LOOPBACK_HOSTS, ServeOptions
    from circuitlab.serve.pages import banner

    opts = replace(ServeOptions.from_args(args), device=args.device)   # the port and the limits refused first, in the explorer's words
    loopback = opts.host in LOOPBACK_HOSTS
    given = opts.given()
    # The model is loaded (and checked) before the server starts: a bad checkpoint is a one-line error.
    app = create_app(opts.checkpoint, max_prompt_chars=opts.max_prompt_chars, max_tokens=opts.max_tokens,
                     allowed_hosts=list(LOOPBACK_HOSTS) if loopback else None, device=opts.device, **given)
    check_port_free(opts.host, opts.port)
    import uvicorn

    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    pages = banner({**given, "run_dir": opts.checkpoint})
    print(f"circuitlab explorer: http://{shown}:{opts.port}/   ({pages}; Ctrl-C stops)")
    if not opts.checkpoint:
        print("no --checkpoint: the explorer page has no model; the adder page works", file=sys.stderr)
    if not loopback:
        print(f"warning: bound to {opts.host}: anyone who can reach this machine can use the explorer",
              file=sys.stderr)
    class Server(uvicorn.Server):
        """uvicorn's server, remembering the signal that stopped it (it shuts down, then passes the signal on)."""

        stopped_by: int | None = None

        def handle_exit(self, sig, frame) -> None:
            self.stopped_by = sig
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning", server_header=False))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if server.stopped_by is None:
        return 0
    from circuitlab.errors import command_line
    from circuitlab.training.interrupts import note_stop

    note_stop(server.stopped_by)   # the exit status and the word (interrupted / terminated) follow the signal
    again = command_line()
    raise KeyboardInterrupt(f"the explorer stopped{f'; start it again with: {again}' if again else ''}")
