#!/usr/bin/env python3
"""zmtp_drop_first.py PORT: a TCP relay on 127.0.0.1 (prints its port) to
a ZeroMQ peer on 127.0.0.1:PORT that, on the first connection only, lets
the ZMTP handshake through, swallows the client's first message (a HELLO)
and closes both ends: what a daemon that closes a fresh connection with
the request still unread looks like to the client. Later connections are
relayed as they are. For tests/integration/test_fetch.sh."""
import socket
import sys
import threading


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise OSError("closed")
        data += part
    return data


def read_frame(sock):
    """One ZMTP 3 frame or command: flags, size (1 or 8 bytes), body."""
    flags = read_exact(sock, 1)
    size_bytes = read_exact(sock, 8 if flags[0] & 0x02 else 1)
    body = read_exact(sock, int.from_bytes(size_bytes, "big"))
    return flags[0], flags + size_bytes + body


def shut(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    shut(src, dst)


def main():
    target = ("127.0.0.1", int(sys.argv[1]))
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    print(lst.getsockname()[1], flush=True)
    first = True
    while True:
        client, _ = lst.accept()
        upstream = socket.create_connection(target)
        if first:
            try:
                # Greetings both ways, then commands (READY) until the
                # client's first message, which never reaches the peer.
                # A connection without a greeting (the client's probe for
                # a refused port) does not count as the first.
                # ZeroMQ sends its greeting's first 10 bytes, then waits
                # for the peer's before the other 54.
                signature = read_exact(client, 10)
                first = False
                back = threading.Thread(target=pump, args=(upstream, client),
                                        daemon=True)
                back.start()
                upstream.sendall(signature)
                upstream.sendall(read_exact(client, 54))
                while True:
                    flags, raw = read_frame(client)
                    if flags & 0x04:
                        upstream.sendall(raw)
                        continue
                    break
            except OSError:
                pass
            # Shut both down and let the pump finish before closing: a
            # descriptor closed under its recv() could be the next
            # connection's, and the pump would steal its bytes.
            shut(client, upstream)
            if not first:
                back.join()
            client.close()
            upstream.close()
            continue
        threading.Thread(target=pump, args=(client, upstream),
                         daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client),
                         daemon=True).start()


main()
