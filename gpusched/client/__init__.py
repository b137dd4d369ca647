"""Talking to the daemon: where things live (paths, modes), the wire protocol,
the socket client and its trust checks, and the submit fast path. Light
imports only: every command pays for them.
"""
