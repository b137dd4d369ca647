"""Scheduling, pure: which GPUs can take a request and which a policy prefers (placement,
topology), the order pending jobs are considered in and which may start (pendingqueue,
queuerules, scheduling, passcounts), dependencies, preemption, and GPU memory estimates,
right-sizing and CUDA out-of-memory retries. The daemon and `gpusched simulate` both call these.

May import the rest of core (models, units, errors, core/spec/syntax.py), nothing else of gpusched.
"""
