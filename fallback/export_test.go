package fallback

// ScalePolicy is the policy the local share enforces for share, for the
// external tests.
var ScalePolicy = scaleToShare
