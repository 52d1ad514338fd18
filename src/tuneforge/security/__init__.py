"""What keeps tenants away from the platform's secrets, network and internals.

egress   the policy every tenant-supplied URL passes (at input and at connect time)
crypto   encryption at rest of tenant secrets and webhook signing secrets
env      the allow-listed environment of every subprocess the platform starts
redact   URLs as logs and consoles may show them: no password, no secret query value
"""
