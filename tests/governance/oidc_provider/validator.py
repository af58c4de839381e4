from oauth2_provider.oauth2_validators import OAuth2Validator


class Validator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, whatever the scopes

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "email_verified": True,
            "preferred_username": user.username,
            "given_name": user.first_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
