"""ldapauthenticator's own LDAPAuthenticator on our hub: the ``ldap-blocking`` hub of ``benchmarks/class_start.py``.

Loaded as the hub's local config (``WORKBENCH_LOCAL_CONFIG``) on a hub with ``WORKBENCH_AUTHENTICATOR=ldap``.
A local config file starts from an empty config of its own (traitlets merges it in afterwards), so the
directory's settings are built here again from the same ``WORKBENCH_LDAP_*`` variables by the hub's own
``login_settings.update_ldap``, and copied onto jupyterhub-ldapauthenticator 2.0.2's ``LDAPAuthenticator``
(the same directory, StartTLS, service account and certificate check), which is then the hub's authenticator
as it comes. Its ``authenticate`` is an ``async def`` that calls the synchronous ldap3 and never awaits, so
each login's connections, TLS handshakes, binds and search run on the hub's event loop: the baseline that
shows what ``WorkbenchLDAPAuthenticator``'s worker thread buys.

Two differences from the ``ldap`` hub, both in the stock class's favour: it searches no groups (it returns
none, and JupyterHub's ``manage_groups`` would refuse every login without them, so it is off here: one search
fewer per login), and it has no lock-out of its own.
"""

import os
import ssl

from traitlets.config import Config

from workbench_hub.login_settings import update_ldap

c = get_config()  # provided by JupyterHub when it loads this file

built = Config()
update_ldap(built, os.environ)
ours = built.WorkbenchLDAPAuthenticator
stock = c.LDAPAuthenticator
for trait in (
    "server_address",
    "server_port",
    "tls_strategy",
    "bind_dn_template",
    "lookup_dn",
    "user_search_base",
    "user_attribute",
    "lookup_dn_user_dn_attribute",
    "lookup_dn_search_user",
    "lookup_dn_search_password",
):
    if trait in ours:
        stock[trait] = ours[trait]
# ldap3 checks no certificate unless told; the same check as WorkbenchLDAPAuthenticator's.
stock.tls_kwargs = {"validate": ssl.CERT_REQUIRED, **({"ca_certs_file": ours.ca_file} if "ca_file" in ours else {})}
c.JupyterHub.authenticator_class = "ldapauthenticator.LDAPAuthenticator"
c.Authenticator.manage_groups = False
