{{/*
Helpers of the railyard chart. Kept to plain Go-template/Sprig constructs (include, printf,
trunc, trimSuffix, hasPrefix, contains, default, quote, toYaml, toJson, nindent, add, eq, not,
or, fail, kindIs, int64, if, range with $key, $value) so that tests/deploy can render the chart
offline; add a construct there before using it here.
*/}}

{{/* The chart name. */}}
{{- define "railyard.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name when it already contains "railyard", else <release>-railyard. */}}
{{- define "railyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select the daemon pods (DaemonSet selector, Service, ServiceMonitor). */}}
{{- define "railyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "railyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: daemon
{{- end }}

{{/* Labels of every object. */}}
{{- define "railyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "railyard.selectorLabels" . }}
{{- end }}

{{/* The daemon image. */}}
{{- define "railyard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Unix socket path, the same in the daemon and the training pods (RAILYARD_SOCKET). */}}
{{- define "railyard.socketPath" -}}
{{ .Values.daemon.socketDir }}/{{ .Values.daemon.socketName }}
{{- end }}

{{/* The Admin API socket: only in the daemon pod (an emptyDir), never in training pods. */}}
{{- define "railyard.adminSocketPath" -}}
{{ .Values.daemon.adminSocketDir }}/{{ .Values.daemon.adminSocketName }}
{{- end }}

{{/*
Combinations of values the chart refuses, with the reason (`helm template` stops with it):
no token source (the daemon would refuse every Connect), an Admin directory that training pods
would see through the socket directory, the demo-only first-session token mode, peer TLS flags
in extraArgs (peerTls sets them), a cert-manager Certificate without names or beside settings
that would not use it, and quota names that are not quota flags.
*/}}
{{- define "railyard.checks" -}}
{{- if not (or .Values.tokenKey.secretName .Values.jobTokens.secretName) }}
{{- fail "set tokenKey.secretName (signed job tokens, --token_key_file) or jobTokens.secretName (static tokens, --job_tokens): without either railyardd refuses every Connect" }}
{{- end }}
{{- if or (eq .Values.daemon.adminSocketDir .Values.daemon.socketDir) (or (hasPrefix (printf "%s/" .Values.daemon.socketDir) .Values.daemon.adminSocketDir) (hasPrefix (printf "%s/" .Values.daemon.adminSocketDir) .Values.daemon.socketDir)) }}
{{- fail "daemon.adminSocketDir must not be, contain or lie inside daemon.socketDir: training pods mount the socket directory, and the Admin socket must stay out of their reach" }}
{{- end }}
{{- range .Values.daemon.extraArgs }}
{{- if contains "insecure_first_session_token" . }}
{{- fail "daemon.extraArgs: the first-session token mode is for demos only; give the daemon tokenKey or jobTokens" }}
{{- end }}
{{- if or (contains "peer_insecure" .) (contains "peer_tls_" .) }}
{{- fail "daemon.extraArgs: the peer TLS flags come from peerTls (secretName, keys, hostPath; insecure only for demos), not from extraArgs" }}
{{- end }}
{{- end }}
{{- if .Values.peerTls.certManager.enabled }}
{{- if .Values.peerTls.insecure }}
{{- fail "peerTls.certManager.enabled with peerTls.insecure: a certificate the daemons would not use" }}
{{- end }}
{{- if .Values.peerTls.hostPath }}
{{- fail "peerTls.certManager.enabled with peerTls.hostPath: the daemons would read the node's directory, not the Secret the Certificate writes" }}
{{- end }}
{{- if not .Values.peerTls.certManager.dnsNames }}
{{- fail "peerTls.certManager.dnsNames: list every node's name (or a *.domain wildcard over them): each daemon's certificate must name its node" }}
{{- end }}
{{- if not .Values.peerTls.certManager.issuerRef.name }}
{{- fail "peerTls.certManager.issuerRef.name: the Issuer or ClusterIssuer that signs the peer certificate" }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.quotas }}
{{- if not (hasPrefix "max_" $name) }}
{{- fail (printf "quotas.%s: not a quota flag (quota flags are named max_*)" $name) }}
{{- end }}
{{- end }}
{{- end }}
