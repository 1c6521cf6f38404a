{{/*
Helpers of the railyard chart. Kept to plain Go-template/Sprig constructs (include, printf,
trunc, trimSuffix, contains, default, quote, toYaml, toJson, nindent, add, if, range) so that
tests/deploy can render the chart offline; add a construct there before using it here.
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
