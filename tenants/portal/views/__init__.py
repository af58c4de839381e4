"""The portal's views, one module per section. Each is thin: resolve the tenant and role
(tenants.portal.access), call selectors or one service, render a template."""
