"""Model artifacts you can trust: signed manifests (manifest.py, signing.py), their check
(verify.py), the keys (keys.py), and, with Django, the trusted keys (trust.py), the check before
every load with its policy, metric and recorded state (load.py) and signed presets (presets.py).
"""
