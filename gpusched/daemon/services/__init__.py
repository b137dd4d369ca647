"""Inference services: their definitions, replicas (ordinary jobs) kept at the number
wanted and replaced on update, the requests that create and change them, each service's
front door (an HAProxy process, driven through gpusched.proc.haproxy) and its metrics.

May import the daemon's state only, of the daemon.
"""
